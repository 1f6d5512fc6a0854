"""SIGKILL a training run at random instants: the folder always loads and resumes (issue 9).

The run is tiny (three batches an epoch), so most of its time goes to writing
the epoch's files, where a kill does harm; the instants are drawn from a
seeded generator, so a failure reproduces.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples.pos_tagging import folder
from examples.pos_tagging.tagger import Tagger
from unroll.atomic import remove_stale_temps

REPO = Path(__file__).resolve().parents[2]
KILLS = 16


def loads(model_dir: Path) -> None:
    """What `tag`, `evaluate` and `--resume` need from a folder with a finished epoch."""
    log = folder.read_log(model_dir)
    if not log:
        return  # no epoch finished: nothing to load yet (--resume refuses; --overwrite starts over)
    assert folder.snapshot_files(log[-1]) <= {p.name for p in model_dir.iterdir()}
    for checkpoint in folder.CHECKPOINTS:
        tagger = Tagger.load(model_dir, checkpoint)
        assert tagger.predict([["the", "dog", "sees", "."]])[0].shape == (4,)


def holds_lock(model_dir: Path, pid: int) -> bool:
    try:
        return (model_dir / folder.LOCK).read_text().strip() == str(pid)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_sigkill_at_random_instants_never_breaks_the_folder(corpus, tmp_path, tiny_args):
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
    # a kill does harm), not compiling
    first = subprocess.run(with_epochs(1), cwd=REPO, env=env, capture_output=True, timeout=300)
    assert first.returncode == 0, first.stderr.decode()
    rng = random.Random(9)
    epochs_seen = []
    for _ in range(KILLS):
        run = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        started = time.monotonic()
        while not holds_lock(model_dir, run.pid) and run.poll() is None:
            assert time.monotonic() - started < 60, "the trainer never took the folder's lock"
            time.sleep(0.01)  # start-up (imports) takes a while: kill once it holds the folder
        time.sleep(rng.uniform(0.0, 1.2))
        run.kill()
        _, err = run.communicate()
        assert run.returncode == -signal.SIGKILL, err.decode()
        loads(model_dir)
        epochs_seen.append(len(folder.read_log(model_dir)))
    assert epochs_seen[-1] > 1, epochs_seen  # the killed runs wrote epochs of their own

    finished = subprocess.run(with_epochs(epochs_seen[-1] + 1), cwd=REPO, env=env,
                              capture_output=True, timeout=120)
    assert finished.returncode == 0, finished.stderr.decode()
    assert len(folder.read_log(model_dir)) == epochs_seen[-1] + 1
    loads(model_dir)
    assert remove_stale_temps(model_dir) == []  # the resumed run cleaned up after the kills
