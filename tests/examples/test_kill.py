"""SIGKILL a training run at chosen events: the folder always loads and resumes.

The run is tiny (three batches an epoch), so most of its time goes to writing
the epoch's files, where a kill does harm. Each kill waits for an event in the
folder (the lock taken, a temp file of an atomic write, log.json committing an
epoch), never for a number of seconds, so a slower or busier machine kills at
the same points of the run; the events are drawn from a seeded generator, so a
failure reproduces. See docs/design.md, 8. Trust and 9. Tests.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples.pos_tagging.schemas import TAGGER_FILES
from examples.pos_tagging.tagger import Tagger
from unroll.core.atomic import remove_stale_temps
from unroll.train import model_folder as folder

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KILLS = 16
#: where a kill lands: as soon as the trainer holds the folder (start-up, reading the
#: snapshot); at the first temp file of an atomic write (an epoch's files half written);
#: right after log.json commits an epoch (old snapshots being deleted); at a temp file once
#: this run has committed an epoch of its own (a resumed run writing its second epoch)
EVENTS = ("locked", "writing", "committed", "writing_again")
#: the events that need the killed run to have committed an epoch first
COMMITS = {"locked": 0, "writing": 0, "committed": 1, "writing_again": 1}


def loads(model_dir: Path) -> None:
    """What `tag`, `evaluate` and `--resume` need from a folder with a finished epoch."""
    log = folder.read_log(model_dir, TAGGER_FILES)
    assert log, "the folder lost its logged epochs"
    assert folder.snapshot_files(log[-1]) <= {p.name for p in model_dir.iterdir()}
    for checkpoint in folder.CHECKPOINTS:
        tagger = Tagger.load(model_dir, checkpoint)
        assert tagger.predict([["the", "dog", "sees", "."]])[0].shape == (4,)


def holds_lock(model_dir: Path, pid: int) -> bool:
    try:
        return (model_dir / folder.LOCK).read_text().strip() == str(pid)
    except FileNotFoundError:
        return False


def temps(model_dir: Path) -> set[str]:
    """The temp files of atomic writes in the folder."""
    return {p.name for p in model_dir.iterdir() if p.name.startswith(".")
            and p.name.endswith(".tmp")}


def logged(model_dir: Path) -> int:
    try:
        return len(folder.read_log(model_dir, TAGGER_FILES))
    except (OSError, ValueError):  # log.json is replaced by a rename: a reader sees either
        return -1


def wait_for(event: str, run: subprocess.Popen, model_dir: Path, limit: float) -> None:
    """Poll the folder until ``event`` happens in ``run`` (see EVENTS); fail past ``limit`` s.

    A "writing" event falls back to the commit that ends the epoch, which always comes,
    where a fast disk wrote its temp files between two polls.
    """
    started = time.monotonic()
    while not holds_lock(model_dir, run.pid):
        assert run.poll() is None, run.communicate()[1].decode()
        assert time.monotonic() - started < limit, "the trainer never took the folder's lock"
        time.sleep(0.001)
    stale, at_start, need = temps(model_dir), logged(model_dir), COMMITS[event]
    while event != "locked":
        assert run.poll() is None, run.communicate()[1].decode()
        assert time.monotonic() - started < limit, f"no {event!r} event within {limit:.0f} s"
        commits = logged(model_dir) - at_start
        if event == "committed":
            if commits >= need:
                return
        elif commits > need or (commits == need and temps(model_dir) - stale):
            return
        time.sleep(0.001)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_sigkill_at_chosen_events_never_breaks_the_folder(corpus, tmp_path, tiny_args):
    model_dir = tmp_path / "m"
    command = [sys.executable, "-m", "examples.pos_tagging", "train", "--data", str(corpus),
               "--model-dir", str(model_dir), "--epochs", "1000", "--quiet", "--resume",
               *tiny_args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), MPLBACKEND="Agg")

    def with_epochs(n):
        at = command.index("1000")
        return [*command[:at], str(n), *command[at + 1:]]

    # one run to its end first: it writes epoch 1 and fills numba's cache of the recurrent
    # kernels, so the killed runs below spend their time training and writing epochs (where
    # a kill does harm), not compiling. Its time is the unit every later wait is bounded by.
    started = time.monotonic()
    first = subprocess.run(with_epochs(1), cwd=REPO, env=env, capture_output=True)
    assert first.returncode == 0, first.stderr.decode()
    limit = 60 + 30 * (time.monotonic() - started)

    rng = random.Random(9)
    events = [rng.choice(EVENTS) for _ in range(KILLS)]
    for event in events:
        run = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        try:
            wait_for(event, run, model_dir, limit)
        finally:
            run.kill()
            _, err = run.communicate()
        assert run.returncode == -signal.SIGKILL, err.decode()
        loads(model_dir)
    epochs = len(folder.read_log(model_dir, TAGGER_FILES))
    assert epochs >= 1 + sum(COMMITS[e] for e in events), events

    finished = subprocess.run(with_epochs(epochs + 1), cwd=REPO, env=env, capture_output=True)
    assert finished.returncode == 0, finished.stderr.decode()
    assert len(folder.read_log(model_dir, TAGGER_FILES)) == epochs + 1
    loads(model_dir)
    assert remove_stale_temps(model_dir) == []  # the resumed run cleaned up after the kills
