"""A model folder that trusts nothing it reads (design: 8. Trust; unroll/train/model_folder.py).

Each test damages a trained folder the way a probe or an accident would: names
that lead out of it, names of its own best weights, missing or unreadable
files, hostile JSON, flipped bits, a full disk, Ctrl-C. The commands refuse
with one line (exit 2), or fail with one line (exit 1), and change no file
outside the folder, nor the folder's own model.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.pos_tagging.__main__ import main
from examples.pos_tagging.schemas import TAGGER_FILES
from examples.pos_tagging.tagger import Tagger
from examples.pos_tagging.train import TrainOptions, train
from tests.examples.conftest import TINY, TINY_ARGS, sentences, write_corpus
from unroll.core.proto import SolverState
from unroll.tools.conllu import write_conllu
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE
from unroll.train import model_folder as folder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(corpus, folder) of a tiny tagger trained two epochs: never changed, copy it."""
    root = tmp_path_factory.mktemp("trained")
    corpus = write_corpus(root / "data")
    model_dir = root / "m"
    train(TrainOptions(data=corpus, model_dir=model_dir, epochs=2, lr=1e-2, quiet=True,
                       sizes=dict(TINY)))
    return corpus, model_dir


@pytest.fixture
def model(trained, tmp_path):
    """A copy of the trained folder, and beside it ``victim``, another model folder."""
    shutil.copytree(trained[1], tmp_path / "m", symlinks=True)
    shutil.copytree(trained[1], tmp_path / "victim", symlinks=True)
    return tmp_path / "m"


def contents(root: Path) -> dict:
    """Every entry under ``root``: bytes of files, targets of symlinks (the lock aside)."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = ("link", os.readlink(path))
        elif path.is_file() and path.name != folder.LOCK:
            out[key] = path.read_bytes()
    return out


def log_of(model_dir: Path) -> list:
    return json.loads((model_dir / folder.LOG).read_text())


def write_log(model_dir: Path, log) -> None:
    (model_dir / folder.LOG).write_text(json.dumps(log))


def vouch_for(model_dir: Path, name: str) -> None:
    """Record the present bytes of ``name`` in every entry of log.json, as a forger would."""
    log = log_of(model_dir)
    for entry in log:
        entry["sha256"][name] = folder.sha256((model_dir / name).read_bytes())
    write_log(model_dir, log)


def one_line(capsys, *parts) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def resume(corpus, model_dir, epochs=3):
    return main(["train", "--data", str(corpus), "--model-dir", str(model_dir), "--epochs",
                 str(epochs), "--quiet", "--resume", *TINY_ARGS])


def tag(model_dir, tmp_path, *options):
    text = tmp_path / "in.txt"
    text.write_text("the cat sees .\na dog .\n")
    return main(["tag", "--model-dir", str(model_dir), str(text), *options])


def evaluate(corpus, model_dir, *options):
    return main(["evaluate", "--model-dir", str(model_dir), str(corpus / DEV_FILE), *options])


@contextlib.contextmanager
def alarm(seconds=120):
    """Turn a command that blocks (a FIFO opened for reading) into a failure, not a hang."""
    def stop(*_):
        raise AssertionError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- names read from the folder are confined to it ------------------------------------

def _leading_out(model_dir: Path, how: str, name: str) -> str:
    victim = model_dir.parent / "victim"
    return {"relative": f"../victim/{name}", "absolute": str(victim / name),
            "subfolder": f"sub/{name}"}[how]


@pytest.mark.parametrize("field", ["snapshot", "average"])
@pytest.mark.parametrize("how", ["relative", "absolute", "subfolder"])
def test_a_log_name_leading_out_of_the_folder_is_refused(trained, model, field, how, capsys):
    corpus = trained[0]
    victim = model.parent / "victim"
    log = log_of(model)
    entry = log[-1]
    entry[field] = _leading_out(model, how, entry[field])
    write_log(model, log)
    before, mine = contents(victim), contents(model)
    assert resume(corpus, model) == 2
    one_line(capsys, "log.json", f"[1].{field}", "--overwrite")
    assert tag(model, model.parent) == 2
    one_line(capsys, "log.json", f"[1].{field}")
    assert contents(victim) == before
    assert contents(model) == mine


@pytest.mark.parametrize("learned", ["../victim/{w}", "{victim}/{w}", "{victim}/best.caffemodel",
                                     "{w}x"])
def test_a_solverstate_naming_weights_elsewhere_is_refused(trained, model, learned, capsys):
    corpus = trained[0]
    victim = model.parent / "victim"
    log = log_of(model)
    entry = log[-1]
    state_path = model / entry["snapshot"]
    weights = folder.snapshot_names(entry["iter"])[1]
    state = SolverState.FromString(state_path.read_bytes())
    state.learned_net = learned.format(w=weights, victim=victim)
    data = state.SerializeToString()
    state_path.write_bytes(data)
    entry["sha256"][entry["snapshot"]] = folder.sha256(data)  # a consistent log: only the name
    write_log(model, log)
    before = contents(victim)
    assert resume(corpus, model) == 2
    one_line(capsys, "learned_net", "--overwrite")
    assert contents(victim) == before


def test_a_solverstate_that_does_not_decode_is_one_line_even_with_its_checksum(trained, model,
                                                                              capsys):
    log = log_of(model)
    entry = log[-1]
    (model / entry["snapshot"]).write_bytes(b"\xff" * 20)
    entry["sha256"][entry["snapshot"]] = folder.sha256(b"\xff" * 20)
    write_log(model, log)
    assert resume(trained[0], model) == 2
    one_line(capsys, entry["snapshot"], "not a solver state", "--overwrite")


def test_symlinks_leading_out_are_never_followed_for_writing(trained, model, capsys):
    corpus = trained[0]
    victim = model.parent / "victim"
    before = contents(victim)
    (model / folder.LOCK).unlink(missing_ok=True)
    (model / folder.LOCK).symlink_to(victim / "best.caffemodel")
    assert resume(corpus, model) == 2
    one_line(capsys, "train.lock is a symlink")
    (model / folder.LOCK).unlink()
    os.link(victim / "log.json", model / folder.LOCK)
    assert resume(corpus, model) == 2
    one_line(capsys, "train.lock is a hard link")
    (model / folder.LOCK).unlink()
    (model / "best.caffemodel").unlink()
    (model / "best.caffemodel").symlink_to(victim / "best.caffemodel")
    assert tag(model, model.parent) == 2
    one_line(capsys, "best.caffemodel: is a symlink leading out of the model folder")
    argv = ["train", "--data", str(corpus), "--model-dir", str(model), "--epochs", "1",
            "--quiet", "--overwrite", *TINY_ARGS]
    assert main(argv) == 0  # replaces the link, not what it points to
    assert contents(victim) == before
    assert not (model / "best.caffemodel").is_symlink()


# -- --resume never deletes the folder's own model --------------------------------------

@pytest.mark.parametrize("field, name", [("average", "best.caffemodel"),
                                         ("average", "last.caffemodel"),
                                         ("snapshot", "best.caffemodel")])
def test_a_log_naming_the_folders_own_weights_is_refused(trained, model, field, name, capsys):
    log = log_of(model)
    log[-1][field] = name
    write_log(model, log)
    before = contents(model)
    assert resume(trained[0], model) == 2
    one_line(capsys, "log.json", f"[1].{field}", "--overwrite")
    assert contents(model) == before


def test_tidying_on_resume_keeps_best_last_and_the_named_snapshot(trained, model):
    log = log_of(model)
    orphan = model / "snapshot_iter_999.solverstate"
    orphan.write_bytes(b"a killed epoch's")
    kept = {n: (model / n).read_bytes() for n in
            (*folder.snapshot_files(log[-1]), "best.caffemodel", "last.caffemodel")}
    assert resume(trained[0], model, epochs=2) == 0  # nothing to train: only tidies
    assert not orphan.exists()
    assert {n: (model / n).read_bytes() for n in kept} == kept


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _loop(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.name)


@pytest.mark.parametrize("damage, part", [
    (lambda m: (m / "log.json").unlink(), "log.json is missing"),
    (lambda m: (m / "config.json").unlink(), "config.json is missing"),
    (lambda m: (m / "features.json").unlink(), "features.json is missing"),
    (lambda m: (m / "log.json").write_text("[]"), "names no finished epoch"),
    (lambda m: _loop(m / "log.json"), "log.json: cannot be read"),
    (lambda m: _loop(m / "config.json"), "config.json: cannot be read"),
    (lambda m: _fifo(m / "config.json"), "config.json: is a FIFO"),
    (lambda m: _fifo(m / "log.json"), "log.json: is a FIFO"),
    (lambda m: (m / "features.json").write_text('{"features": {}, "chars": 3}'),
     "features.json: its checksum is not the one log.json records"),
    (lambda m: (m / folder.read_log(m, TAGGER_FILES)[-1]["snapshot"]).unlink(), "is missing"),
])
def test_resume_refuses_a_folder_it_cannot_continue(trained, model, damage, part, capsys):
    damage(model)
    before = contents(model)
    with alarm():
        assert resume(trained[0], model) == 2
    one_line(capsys, "--resume:", part, "--overwrite")
    assert contents(model) == before  # nothing deleted, nothing started over


def test_tag_does_not_block_on_a_fifo(model, capsys):
    _fifo(model / "features.json")
    with alarm():
        assert tag(model, model.parent) == 2
    one_line(capsys, "features.json", "FIFO")


# -- hostile JSON: one line naming the file and the field ----------------------------

def _config(change):
    def damage(m):
        config = json.loads((m / "config.json").read_text())
        change(config)
        (m / "config.json").write_text(json.dumps(config))
    return damage


def _log_entry(key, value):
    def damage(m):
        log = log_of(m)
        log[-1][key] = value
        write_log(m, log)
    return damage


def _features_text(old, new):
    def damage(m):
        text = (m / "features.json").read_text()
        assert old in text
        (m / "features.json").write_text(text.replace(old, new, 1))
    return damage


def _config_text(old, new):
    def damage(m):
        text = (m / "config.json").read_text()
        assert old in text
        (m / "config.json").write_text(text.replace(old, new, 1))
    return damage


def _log_seconds(text):
    def damage(m):
        log = (m / "log.json").read_text()
        changed = re.sub(r'"seconds": [-+.eE0-9]+', f'"seconds": {text}', log, count=1)
        assert changed != log
        (m / "log.json").write_text(changed)
    return damage


def _deep(name):
    return lambda m: (m / name).write_text("[" * 100_000 + "]" * 100_000)


HOSTILE = [
    ("features.json", _features_text('"counts": [', '"counts": [1e400, '),
     "features.word.counts[0] must be a count (an integer >= 0), found 1e400"),
    ("features.json", _features_text('"counts": [', '"counts": [1' + "0" * 5000 + ', '),
     "features.word.counts[0] must be a count (an integer >= 0), found 10000"),
    ("features.json", _features_text('"counts": [', '"counts": [NaN, '),
     "features.word.counts[0] must be a count (an integer >= 0), found NaN"),
    ("config.json", _config_text('"dropout": 0.0', '"dropout": -Infinity'),
     "dropout must be a number in [0, 1), found -Infinity"),
    ("log.json", _log_seconds("1e999"),
     "[0].seconds must be a finite number >= 0, found 1e999"),
    ("log.json", _log_entry("lr", 0.1), "unknown key(s) ['lr'] in [1]"),
    ("features.json", _deep("features.json"), "nested deeper"),
    ("config.json", _deep("config.json"), "nested deeper"),
    ("log.json", _deep("log.json"), "nested deeper"),
    ("config.json", _config(lambda c: c.update(batch=10**9)), "batch must be at most"),
    ("config.json", _config(lambda c: c.update(chars={"embed": 8, "hidden": 8,
                                                      "length": 10**9})),
     "chars.length must be at most"),
    ("config.json", _config(lambda c: c.update(hidden=1e9)), "hidden must be an integer"),
    ("config.json", _config(lambda c: c.update(embed=True)), "embed must be an integer"),
    ("config.json", _config(lambda c: c.update(dropout="0.5")), "dropout must be a number"),
    ("config.json", _config(lambda c: c.update(cell="../victim/x.prototxt.j2")),
     "neither a built-in"),
    ("log.json", _log_entry("snapshot", 5), "[1].snapshot must be"),
    ("log.json", _log_entry("average", None), "[1].average must be"),
    ("log.json", _log_entry("dev_accuracy", "0.9"), "[1].dev_accuracy must be"),
    ("log.json", _log_entry("epoch", 1), "[1].epoch is 1"),
    ("log.json", _log_entry("seconds", -1), "[1].seconds must be"),
    ("log.json", _log_entry("sha256", {}), "[1].sha256 must hold"),
    ("log.json", lambda m: write_log(m, {"epoch": 1}), "expected a list"),
]


@pytest.mark.parametrize("name, damage, part", HOSTILE,
                         ids=[f"{n}-{p}" for n, _, p in HOSTILE])
def test_hostile_json_is_one_line_naming_file_and_field(trained, model, name, damage, part,
                                                        capsys):
    corpus = trained[0]
    damage(model)
    if name != folder.LOG:  # log.json vouches for the damage: what the schema finds is left
        vouch_for(model, name)
    before = contents(model)
    assert tag(model, model.parent) == 2
    one_line(capsys, name, part)
    assert evaluate(corpus, model) == 2
    one_line(capsys, name, part)
    assert resume(corpus, model) == 2
    one_line(capsys, name, part, "--overwrite")
    assert contents(model) == before


def test_a_config_that_does_not_fit_the_weights_is_refused(trained, model, capsys):
    _config(lambda c: c.update(hidden=9))(model)  # valid, but not what the weights are
    vouch_for(model, "config.json")
    before = contents(model)
    assert tag(model, model.parent) == 2
    one_line(capsys, "best.caffemodel")
    argv = ["train", "--data", str(trained[0]), "--model-dir", str(model), "--epochs", "3",
            "--quiet", "--resume"]  # no sizes asked: the folder's are taken
    assert main(argv) == 2
    one_line(capsys, "--resume:", "snapshot_iter_", "has shape", "--overwrite")
    assert contents(model) == before


# -- checksums ---------------------------------------------------------------------

def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x10  # in the floats of a blob: still a valid protobuf
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("checkpoint", folder.CHECKPOINTS)
def test_a_flipped_bit_in_a_checkpoint_is_an_error(trained, model, checkpoint, capsys):
    path = model / f"{checkpoint}.caffemodel"
    _flip(path)
    assert tag(model, model.parent, "--checkpoint", checkpoint) == 2
    one_line(capsys, f"{checkpoint}.caffemodel: its checksum")
    assert evaluate(trained[0], model, "--checkpoint", checkpoint) == 2
    one_line(capsys, f"{checkpoint}.caffemodel: its checksum")


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_flipped_bit_in_the_snapshot_is_refused_by_resume(trained, model, which, capsys):
    name = folder.snapshot_names(log_of(model)[-1]["iter"])[which]
    _flip(model / name)
    before = contents(model)
    assert resume(trained[0], model) == 2
    one_line(capsys, f"{name}: its checksum", "--overwrite")
    assert contents(model) == before


def test_a_kill_between_log_and_checkpoint_copy_still_loads_and_is_repaired(trained, model):
    """log.json commits an epoch before last/best are replaced: the previous epoch's copy is
    vouched for by the previous entry, and the next trainer finishes the copy."""
    log = log_of(model)
    first = Tagger.load(trained[1], "last").train_model.to_proto().SerializeToString()
    (model / "last.caffemodel").write_bytes(first)  # as if killed before replacing it
    if log[-1]["sha256"]["last.caffemodel"] == log[0]["sha256"]["last.caffemodel"]:
        pytest.skip("both epochs gave the same weights")
    Tagger.load(model, "last")
    assert resume(trained[0], model, epochs=2) == 0
    assert folder.sha256((model / "last.caffemodel").read_bytes()) == \
        log[-1]["sha256"]["last.caffemodel"]


# -- output is complete or an error ------------------------------------------------

def _tmpfs(where: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; /dev/full covers standard output")
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(where)],
                          capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


def test_tag_conllu_on_a_full_disk_is_one_line_and_status_1(model, tmp_path, capsys,
                                                             monkeypatch):
    big = tmp_path / "big.conllu"
    many = sentences(600, 3)
    write_conllu([f for f, _ in many], [t for _, t in many], big)
    assert big.stat().st_size > 32 * 1024
    full = tmp_path / "full"
    _tmpfs(full)
    try:
        with open(full / "out.conllu", "w") as out:
            monkeypatch.setattr(sys, "stdout", out)
            status = main(["tag", "--model-dir", str(model), "--conllu", str(big)])
            monkeypatch.undo()
            with contextlib.suppress(OSError):
                out.close()
        assert status == 1
        one_line(capsys, "No space left on device", "standard output")
    finally:
        subprocess.run(["umount", str(full)], check=True)


@pytest.mark.slow
def test_tag_conllu_redirected_to_a_full_disk_exits_1(model, tmp_path):
    """As a shell runs it: the output is a file on a full disk, not a Python stream."""
    big = tmp_path / "big.conllu"
    many = sentences(600, 3)
    write_conllu([f for f, _ in many], [t for _, t in many], big)
    full = tmp_path / "full"
    _tmpfs(full)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]))
    try:
        with open(full / "out.conllu", "wb") as out:
            done = subprocess.run(
                [sys.executable, "-m", "examples.pos_tagging", "tag", "--model-dir", str(model),
                 "--conllu", str(big)], cwd=REPO, env=env, stdout=out, stderr=subprocess.PIPE,
                text=True, timeout=300)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "standard output" in lines[0], done.stderr
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_a_closed_pipe_ends_tag_quietly(model, capsys, monkeypatch):
    """`tag ... | head -1`: the reader went away; no error, no traceback, status 141."""
    read, write = os.pipe()
    os.close(read)
    with open(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        status = tag(model, model.parent)
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            out.close()
    assert status == 141
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", ["tag", "tag --conllu", "evaluate"])
def test_output_to_a_full_device_is_one_line_and_status_1(trained, model, command, capsys,
                                                          monkeypatch):
    corpus = trained[0]
    argv = {"tag": ["tag", str(corpus / TRAIN_FILE)],
            "tag --conllu": ["tag", "--conllu", str(corpus / TRAIN_FILE)],
            "evaluate": ["evaluate", str(corpus / DEV_FILE)]}[command]
    with open("/dev/full", "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        status = main([*argv, "--model-dir", str(model)])
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            out.close()
    assert status == 1
    one_line(capsys, "No space left on device", "standard output")


# -- Ctrl-C ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="needs SIGINT")
def test_sigint_ends_training_with_one_line_and_the_folder_resumes(trained, tmp_path):
    corpus = trained[0]
    model_dir = tmp_path / "m"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    run = subprocess.Popen(
        [sys.executable, "-m", "examples.pos_tagging", "train", "--data", str(corpus),
         "--model-dir", str(model_dir), "--epochs", "100000", "--quiet", *TINY_ARGS],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a test run in the background (no job control) ignores SIGINT, and so would the
        # trainer it starts: give it the default, as a terminal's foreground job has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in run.stdout:  # the event: an epoch has ended and been committed
            if line.startswith("epoch 2:"):
                break
        else:
            pytest.fail(f"training ended before its second epoch: {run.stderr.read()}")
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 130, err
    assert err.strip().splitlines() == [
        "python -m examples.pos_tagging train: interrupted; resume with --resume"]
    log = folder.read_log(model_dir, TAGGER_FILES)
    assert len(log) >= 2
    for checkpoint in folder.CHECKPOINTS:
        Tagger.load(model_dir, checkpoint)
    assert resume(corpus, model_dir, epochs=len(log) + 1) == 0
    assert len(folder.read_log(model_dir, TAGGER_FILES)) == len(log) + 1
    assert not [p for p in model_dir.iterdir() if p.name.endswith(".tmp")]


# -- --resume continues the random streams -----------------------------------------

def test_resume_with_dropout_equals_the_uninterrupted_run_bit_for_bit(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    train_sents = sentences(24, 0)
    # words seen once in training, for word dropout to draw on
    train_sents = [([*forms[:-1], f"thing{k}", forms[-1]], [*tags[:-1], "NOUN", tags[-1]])
                   for k, (forms, tags) in enumerate(train_sents)]
    write_conllu([f for f, _ in train_sents], [t for _, t in train_sents], data / TRAIN_FILE)
    dev = sentences(8, 1)
    write_conllu([f for f, _ in dev], [t for _, t in dev], data / DEV_FILE)
    sizes = dict(TINY, dropout=0.3, word_dropout=0.5)

    def run(model_dir, epochs, resume=False):
        return train(TrainOptions(data=data, model_dir=model_dir, epochs=epochs, lr=1e-2,
                                  quiet=True, sizes=dict(sizes), resume=resume, seed=3))

    run(tmp_path / "straight", 3)
    run(tmp_path / "split", 1)
    run(tmp_path / "split", 3, resume=True)
    straight, split = log_of(tmp_path / "straight"), log_of(tmp_path / "split")
    assert [e["train_loss"] for e in split] == [e["train_loss"] for e in straight]
    assert [e["sha256"] for e in split] == [e["sha256"] for e in straight]
    for name in ("last.caffemodel", "best.caffemodel", straight[-1]["snapshot"]):
        assert (tmp_path / "split" / name).read_bytes() == \
            (tmp_path / "straight" / name).read_bytes()


# -- the property: any mutation of the JSON files works or is one line --------------

VALUES = st.sampled_from([
    None, True, False, 0, 1, 2, 7, 9, -1, 10**9, 10**30, 2**63, 0.5, -0.0, 1.5, 1e308, "",
    "lstm", "x", "../victim/best.caffemodel", "/etc/passwd", "best.caffemodel",
    "snapshot_iter_6.solverstate", "0" * 64, [], {}, [1, 2], {"tokens": []},
])


def _leaves(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for k, v in enumerate(value[:40]):
            yield from _leaves(v, (*path, k))


def _set(value, path, new):
    if not path:
        return new
    target = value
    for key in path[:-1]:
        target = target[key]
    if new is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = new
    return value


_DELETE = object()


@st.composite
def mutations(draw):
    """(file name, how to change it) for one of the folder's JSON files."""
    name = draw(st.sampled_from([folder.CONFIG, folder.FEATURES, folder.LOG]))
    kind = draw(st.sampled_from(["value", "value", "delete key", "nest", "delete file",
                                 "bytes"]))
    return name, kind, draw(VALUES), draw(st.integers(0, 10**6)), draw(st.integers(1, 300)), \
        draw(st.binary(max_size=40))


def _mutate(model_dir: Path, mutation) -> None:
    name, kind, new, pick, depth, data = mutation
    path = model_dir / name
    if kind == "delete file":
        path.unlink()
        return
    if kind == "bytes":
        path.write_bytes(data)
        return
    value = json.loads(path.read_text())
    leaves = [p for p in _leaves(value) if kind != "delete key" or p]
    at = leaves[pick % len(leaves)] if leaves else ()
    if kind == "delete key" and at:
        value = _set(value, at, _DELETE)
    elif kind == "nest":
        nested = new
        for _ in range(depth):
            nested = [nested]
        value = _set(value, at, nested)
    else:
        value = _set(value, at, new)
    path.write_text(json.dumps(value))


@settings(max_examples=50, deadline=None)
@given(mutation=mutations())
def test_any_mutated_folder_works_or_is_refused_in_one_line(trained, tmp_path_factory,
                                                            mutation, capsys):
    corpus, original = trained
    root = tmp_path_factory.mktemp("mutated")
    model_dir = root / "m"
    shutil.copytree(original, model_dir)
    shutil.copytree(original, root / "victim")
    _mutate(model_dir, mutation)
    outside, corpus_before = contents(root / "victim"), contents(corpus)
    best = (model_dir / "best.caffemodel").read_bytes()
    capsys.readouterr()
    for command in (lambda: tag(model_dir, root), lambda: evaluate(corpus, model_dir),
                    lambda: resume(corpus, model_dir, epochs=2)):
        status = command()
        err = capsys.readouterr().err
        assert "Traceback" not in err
        if status:
            assert status == 2, err
            assert len(err.strip().splitlines()) == 1, err
    assert contents(root / "victim") == outside
    assert contents(corpus) == corpus_before
    assert (model_dir / "best.caffemodel").read_bytes() == best
