"""What every application's command line guarantees, parametrized over tests/examples/apps.py.

docs/design.md, 10. Training: the options every application shares refuse a bad value
in one line; Ctrl-C ends a training in one line with status 130, and ``--resume`` then
gives the uninterrupted run's files bit for bit; a folder killed before its first epoch
is trained again without ``--overwrite``; ``fetch`` and ``-o`` work for every one. Each
interrupt waits for an event in the folder (the lock taken, a temp file of an atomic
write, log.json committing an epoch), never for a number of seconds; they come in an order
drawn by a seeded generator.

8. Trust: every file prediction reads from the folder, tampered with, is refused in one
line or changes nothing of the output; a FIFO or a device in its place is refused at once,
naming it. ``-o`` goes through a device, a symlink and a FIFO as ``> OUT`` would, and a
CoNLL-U input with CR, CRLF or a BOM is read and written back with them.
"""

import importlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli_helpers import one_line_error
from tests.examples.apps import APPS
from tests.hang import at_once, limit
from unroll.train import model_folder as folder

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 3
#: where Ctrl-C lands: as soon as the trainer holds the folder; at the first temp file of an
#: atomic write once n epochs are committed (n = 0: the application's own files, before any
#: epoch); right after epoch n is committed
EVENTS = [("locked", 0), ("writing", 0), ("committed", 1), ("writing", 1), ("committed", 2),
          ("writing", 2)]


def python(app, *args, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, *app.command(*args)], cwd=REPO, env=env,
                          capture_output=True, timeout=limit(200), **kwargs)


def train_argv(app, data: Path, model_dir: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(data), "--model-dir", str(model_dir), "--epochs",
            str(EPOCHS), "--quiet", *app.train, *extra]


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
@pytest.mark.parametrize("option, value", [("--epochs", "0"), ("--limit", "-1"),
                                           ("--limit", "0"), ("--max-minutes", "-1"),
                                           ("--seed", "-2"), ("--threads", "0")])
def test_a_bad_count_is_refused_in_one_line_and_leaves_no_folder(app, option, value, tmp_path,
                                                                 capsys):
    model_dir = tmp_path / "m"
    main = importlib.import_module(f"{app.module}.__main__").main
    with pytest.raises(SystemExit) as stop:
        main(train_argv(app, app.corpus(tmp_path / "data"), model_dir, option, value))
    assert stop.value.code == 2
    one_line_error(capsys, f"python -m {app.module} train: error: argument {option}: expected")
    assert not model_dir.exists()


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_a_bad_rate_or_ratio_is_refused_in_one_line_and_leaves_no_folder(app, tmp_path, capsys):
    data, model_dir = app.corpus(tmp_path / "data"), tmp_path / "m"
    main = importlib.import_module(f"{app.module}.__main__").main
    bad = [(o, v) for o in app.rates for v in ("nan", "inf", "-1", "0", "x")]
    bad += [(o, v) for o in app.ratios for v in ("nan", "-0.1", "1", "x")]
    for option, value in bad:
        with pytest.raises(SystemExit) as stop:
            main(train_argv(app, data, model_dir, option, value))
        assert stop.value.code == 2, (option, value)
        one_line_error(capsys, f"python -m {app.module} train: error: argument {option}: "
                               f"expected")
        assert not model_dir.exists()


@pytest.mark.parametrize(("app", "option", "first", "second"),
                         [(app, *values) for app in APPS for values in app.recorded],
                         ids=lambda v: v.name if hasattr(v, "name") else v)
def test_a_recorded_option_is_logged_and_a_resume_takes_it_or_refuses_another(
        app, option, first, second, tmp_path, capsys):
    data, model_dir = app.corpus(tmp_path / "data"), tmp_path / "m"
    main = importlib.import_module(f"{app.module}.__main__").main

    def logged():
        return [e["options"][option] for e in json.loads((model_dir / folder.LOG).read_text())]

    assert main([*train_argv(app, data, model_dir, option, first), "--epochs", "1"]) == 0
    assert logged() == [float(first)]
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    capsys.readouterr()
    resumed = [*train_argv(app, data, model_dir, option, second), "--epochs", "2", "--resume"]
    assert main(resumed) == 2
    one_line_error(capsys, f"{model_dir} was trained with {option} {first}",
                   f"given {option} {second}")
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before
    # not given, the folder's value is taken
    assert main([*train_argv(app, data, model_dir), "--epochs", "2", "--resume"]) == 0
    assert logged() == [float(first)] * 2


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_evaluate_takes_the_shared_split_option_and_refuses_another_split(app, capsys):
    main = importlib.import_module(f"{app.module}.__main__").main
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert "(default dev: tune on dev; score test once" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as stop:
        main(["evaluate", "--split", "valid"])
    assert stop.value.code == 2
    one_line_error(capsys, f"python -m {app.module} evaluate: error: argument --split: invalid "
                           f"choice: 'valid'", "'dev'", "'test'")


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_the_data_help_names_its_default_folders_as_paths(app, capsys):
    main = importlib.import_module(f"{app.module}.__main__").main
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "../shared/data/ud_english_ewt from the checkout" in help_text
    assert "('" not in help_text


def committed(model_dir: Path) -> int:
    try:
        return len(json.loads((model_dir / folder.LOG).read_text()))
    except (OSError, ValueError):  # log.json is replaced by a rename: a reader sees either
        return 0


def temps(model_dir: Path) -> set[str]:
    try:
        return {p.name for p in model_dir.iterdir() if p.name.endswith(".tmp")}
    except FileNotFoundError:
        return set()


def holds_lock(model_dir: Path, pid: int) -> bool:
    try:
        return (model_dir / folder.LOCK).read_text().strip() == str(pid)
    except FileNotFoundError:
        return False


def wait_for(event: str, n: int, run: subprocess.Popen, model_dir: Path) -> bool:
    """Poll the folder until ``event`` (after ``n`` commits); False if the run ended first."""
    started = time.monotonic()
    while True:
        if run.poll() is not None:
            return False
        assert time.monotonic() - started < limit(200), f"no {event!r} event"
        if holds_lock(model_dir, run.pid) and (
            event == "locked" or (event == "committed" and committed(model_dir) >= n)
            or (event == "writing" and committed(model_dir) >= n and temps(model_dir))
        ):
            return True
        time.sleep(0.001)


def wait_for_own_files(app, run: subprocess.Popen, model_dir: Path) -> bool:
    """Poll until the application's own files are in the folder (written before any epoch
    runs); False if the run ended first."""
    started = time.monotonic()
    while not all((model_dir / name).exists() for name in app.files):
        if run.poll() is not None:
            return False
        assert time.monotonic() - started < limit(200), f"no {app.files} in {model_dir}"
        time.sleep(0.001)
    return True


def final_files(model_dir: Path) -> dict:
    """The bytes of the last epoch's weights, solver state and average, and the log without
    its times."""
    log = json.loads((model_dir / folder.LOG).read_text())
    names = sorted(folder.snapshot_files(log[-1]) | {"last.caffemodel", "best.caffemodel"})
    kept = {name: (model_dir / name).read_bytes() for name in names}
    kept[folder.LOG] = [{k: v for k, v in e.items() if k not in ("seconds", "tokens_per_s")}
                        for e in log]
    return kept


@pytest.mark.slow
@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_ctrl_c_anywhere_is_one_line_130_and_resume_gives_the_uninterrupted_run(app, tmp_path):
    data = app.corpus(tmp_path / "data")
    whole = tmp_path / "whole"
    done = python(app, *train_argv(app, data, whole))
    assert done.returncode == 0, done.stderr.decode()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), MPLBACKEND="Agg")
    for k, (event, n) in enumerate(random.Random(33).sample(EVENTS, len(EVENTS))):
        model_dir = tmp_path / f"interrupted-{k}"
        run = subprocess.Popen([sys.executable, *app.command(*train_argv(app, data, model_dir))],
                               cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        try:
            if wait_for(event, n, run, model_dir):
                run.send_signal(signal.SIGINT)
            _, err = run.communicate(timeout=limit(200))
        finally:
            run.kill()
        err = err.decode()
        if run.returncode != 0:  # else the run ended before the event
            assert run.returncode == 130, err
            assert err.strip().splitlines() == [
                f"python -m {app.module} train: interrupted; resume with --resume"], err
        resumed = python(app, *train_argv(app, data, model_dir, "--resume"))
        assert resumed.returncode == 0, (event, n, resumed.stderr.decode())
        assert final_files(model_dir) == final_files(whole), (event, n)


@pytest.mark.slow
@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_a_folder_killed_before_its_first_epoch_is_trained_without_overwrite(app, tmp_path):
    data, model_dir = app.corpus(tmp_path / "data"), tmp_path / "m"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), MPLBACKEND="Agg")
    for _ in range(5):  # a run whose first epoch commits before it is stopped is run again
        shutil.rmtree(model_dir, ignore_errors=True)
        run = subprocess.Popen([sys.executable, *app.command(*train_argv(app, data, model_dir))],
                               cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        try:
            # the application's files precede the first commit; stopped, the run cannot
            # commit between the look at log.json and the kill
            assert wait_for_own_files(app, run, model_dir), run.communicate()[1].decode()
            run.send_signal(signal.SIGSTOP)
            before_first_commit = not (model_dir / folder.LOG).exists()
            run.kill()
            run.communicate(timeout=limit(200))
        finally:
            run.kill()
        if before_first_commit:
            break
    assert before_first_commit, "every run committed its first epoch before it was stopped"
    assert committed(model_dir) == 0
    again = python(app, *train_argv(app, data, model_dir))
    assert again.returncode == 0, again.stderr.decode()
    whole = tmp_path / "whole"
    assert python(app, *train_argv(app, data, whole)).returncode == 0
    assert final_files(model_dir) == final_files(whole)


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_a_diverged_training_is_one_line_on_stderr_and_status_1(app, tmp_path):
    # subprocesses: pytest would catch NumPy's RuntimeWarnings before they reach stderr
    data = app.corpus(tmp_path / "data")
    run = python(app, *train_argv(app, data, tmp_path / "nan", "--lr", "1e38"))
    assert run.returncode == 1, run.stderr.decode()
    lines = run.stderr.decode().splitlines()
    assert len(lines) == 1 and "training diverged at " in lines[0], lines
    # weights that grow huge but stay finite overflow in evaluation and prediction
    huge = tmp_path / "huge"
    run = python(app, *train_argv(app, data, huge, "--lr", "1e20"))
    lines = run.stderr.decode().splitlines()
    if run.returncode:
        assert len(lines) == 1 and "training diverged at " in lines[0], lines
    else:
        assert lines == []
        for command in (app.evaluate, app.predict):
            argv = [a.replace("{input}", str(data / "en_ewt-ud-dev.conllu")) for a in command]
            extra = ("--data", str(data)) if "--split" in argv else ()
            err = python(app, *argv, "--model-dir", str(huge), *extra).stderr.decode()
            assert "Warning" not in err and len(err.splitlines()) <= 1, err


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_every_application_fetches_and_says_in_one_line_why_it_could_not(app, capsys):
    main = importlib.import_module(f"{app.module}.__main__").main
    # conftest points the mirror at a closed port on 127.0.0.1
    assert main(["fetch", "--quiet"]) == 2
    one_line_error(capsys, f"python -m {app.module} fetch: error: ", "127.0.0.1")


@pytest.mark.slow
@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_o_writes_what_standard_output_gets(app, tmp_path, capsys):
    from unroll.tools.ewt import DEV_FILE

    main = importlib.import_module(f"{app.module}.__main__").main
    data = app.corpus(tmp_path / "data")
    model_dir = tmp_path / "m"
    assert main([*train_argv(app, data, model_dir), "--epochs", "1"]) == 0  # the last counts
    folder_args = ["--model-dir", str(model_dir)]
    for command in (app.predict, app.evaluate):
        argv = [a.replace("{input}", str(data / DEV_FILE)) for a in command] + folder_args
        if command is app.evaluate:
            argv += ["--data", str(data)]
        capsys.readouterr()
        assert main(argv) == 0
        printed = capsys.readouterr().out.encode()
        out = tmp_path / f"{command[0]}.out"
        assert main([*argv, "-o", str(out)]) == 0
        assert capsys.readouterr().out == "" and out.read_bytes() == printed and printed


# -- a trained folder, damaged: its commands refuse in one line or are unchanged ---------

@pytest.fixture(scope="module", params=APPS, ids=lambda a: a.name)
def trained(request, tmp_path_factory):
    """(application, its corpus, a tiny folder trained two epochs, one trained from another
    seed): never changed, copy them."""
    app = request.param
    root = tmp_path_factory.mktemp(app.name)
    data = app.corpus(root / "data")
    main = importlib.import_module(f"{app.module}.__main__").main
    for name, seed in (("m", "0"), ("other", "1")):
        status = main([*train_argv(app, data, root / name), "--epochs", "2", "--seed", seed])
        assert status == 0
    return app, data, root / "m", root / "other"


def predict_argv(app, data: Path, model_dir: Path, *extra: str) -> list[str]:
    """The application's prediction command on the corpus' dev split (see apps.py)."""
    from unroll.tools.ewt import DEV_FILE

    return [*(a.replace("{input}", str(data / DEV_FILE)) for a in app.predict),
            "--model-dir", str(model_dir), *extra]


def predicted(app, argv: list[str], capsys) -> tuple[int, str, str]:
    """(status, standard output, standard error) of a command run in this process, which
    must not block (a FIFO opened for reading would)."""
    main = importlib.import_module(f"{app.module}.__main__").main
    capsys.readouterr()
    status = at_once(main, argv, units=60)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.slow
def test_evaluate_scores_dev_unless_told_otherwise(trained, capsys):
    app, data, model_dir, _ = trained
    argv = ["evaluate", "--model-dir", str(model_dir), "--data", str(data)]
    status, out, err = predicted(app, [*argv, "--split", "dev"], capsys)
    assert (status, err) == (0, "") and out
    assert predicted(app, argv, capsys) == (status, out, err)


def read_files(app) -> list[str]:
    """What prediction reads from the folder: the application's files, the log, the weights."""
    return [*app.files, folder.LOG, "best.caffemodel"]


def _reversed_lists(value):
    if isinstance(value, list):
        return [_reversed_lists(v) for v in reversed(value)]
    if isinstance(value, dict):
        return {k: _reversed_lists(v) for k, v in value.items()}
    return value


#: how a file is tampered with: (its path, the folder trained from another seed)
TAMPERINGS = {
    "lists reversed": lambda path, other: path.write_text(json.dumps(_reversed_lists(
        json.loads(path.read_text())))) if path.suffix == ".json" else None,
    "a bit flipped": lambda path, other: path.write_bytes(
        (lambda b: b[:len(b) // 2] + bytes([b[len(b) // 2] ^ 1]) + b[len(b) // 2 + 1:])(
            path.read_bytes())),
    "cut in half": lambda path, other: path.write_bytes(path.read_bytes()[
        :len(path.read_bytes()) // 2]),
    "another training's": lambda path, other: path.write_bytes((other / path.name).read_bytes()),
    "nested 100,000 deep": lambda path, other: path.write_bytes(b"[" * 100_000 + b"]" * 100_000),
}


@pytest.mark.slow
@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_a_tampered_folder_file_is_refused_in_one_line_or_changes_nothing(trained, tampering,
                                                                          tmp_path, capsys):
    app, data, original, other = trained
    status, clean, _ = predicted(app, predict_argv(app, data, original), capsys)
    assert status == 0
    for name in read_files(app):
        model_dir = tmp_path / name
        shutil.copytree(original, model_dir)
        before = (model_dir / name).read_bytes()
        TAMPERINGS[tampering](model_dir / name, other)
        if (model_dir / name).read_bytes() == before:
            continue  # nothing to tamper with (weights have no lists to reverse)
        status, out, err = predicted(app, predict_argv(app, data, model_dir), capsys)
        assert "Traceback" not in err, (name, err)
        if status:
            assert status == 2 and len(err.strip().splitlines()) == 1, (name, err)
        else:
            assert out == clean, f"{name} {tampering}: the output changed silently"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "link to a fifo"])
def test_a_fifo_or_a_device_in_place_of_a_folder_file_is_refused_at_once(trained, kind,
                                                                        tmp_path, capsys):
    app, data, original, _ = trained
    for name in read_files(app):
        model_dir = tmp_path / name
        shutil.copytree(original, model_dir)
        path = model_dir / name
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "link to /dev/zero":
            path.symlink_to(os.devnull.replace("null", "zero"))
        else:
            os.mkfifo(tmp_path / f"{name}.fifo")
            path.symlink_to(tmp_path / f"{name}.fifo")
        status, _, err = predicted(app, predict_argv(app, data, model_dir), capsys)
        assert status == 2, (name, err)
        one_line = err.strip().splitlines()
        assert len(one_line) == 1 and name in one_line[0], (name, err)


# -- -o OUT and line ends ---------------------------------------------------------------

@pytest.mark.slow
def test_o_is_written_through_a_device_a_symlink_and_a_fifo(trained, tmp_path, capsys):
    app, data, model_dir, _ = trained
    argv = predict_argv(app, data, model_dir)
    status, printed, _ = predicted(app, argv, capsys)
    assert status == 0 and printed
    assert predicted(app, [*argv, "-o", os.devnull], capsys)[:2] == (0, "")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    target, link = tmp_path / "mine.out", tmp_path / "link.out"
    target.write_text("old\n")
    link.symlink_to(target.name)
    assert predicted(app, [*argv, "-o", str(link)], capsys)[:2] == (0, "")
    assert link.is_symlink() and target.read_text() == printed
    fifo, got = tmp_path / "out.fifo", []
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert predicted(app, [*argv, "-o", str(fifo)], capsys)[:2] == (0, "")
    reader.join(limit(10))
    assert got == [printed.encode()] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


#: line ends and a byte-order mark, each as a change of an LF file's bytes
ENDS = {"CR": lambda b: b.replace(b"\n", b"\r"), "CRLF": lambda b: b.replace(b"\n", b"\r\n"),
        "BOM": lambda b: b"\xef\xbb\xbf" + b}


@pytest.mark.slow
@pytest.mark.parametrize("end", sorted(ENDS))
@pytest.mark.parametrize("app", [a for a in APPS if "{input}" in a.predict],
                         ids=lambda a: a.name)
def test_cr_crlf_and_a_bom_are_read_and_written_back_as_they_came(app, end, tmp_path, capsys):
    from unroll.tools.ewt import DEV_FILE

    data = app.corpus(tmp_path / "data")
    model_dir = tmp_path / "m"
    main = importlib.import_module(f"{app.module}.__main__").main
    assert main([*train_argv(app, data, model_dir), "--epochs", "1"]) == 0
    status, lf, _ = predicted(app, predict_argv(app, data, model_dir), capsys)
    assert status == 0
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / DEV_FILE).write_bytes(ENDS[end]((data / DEV_FILE).read_bytes()))
    out = tmp_path / "out"
    status, _, err = predicted(app, predict_argv(app, changed, model_dir, "-o", str(out)),
                               capsys)
    assert status == 0, err
    assert out.read_bytes() == ENDS[end](lf.encode())


@pytest.mark.slow
@pytest.mark.parametrize("app", [a for a in APPS if "{input}" in a.predict],
                         ids=lambda a: a.name)
def test_a_device_as_the_input_is_refused_at_once(app, tmp_path, capsys):
    """The file to label a device, or a link to /dev/zero (which would never end): one
    line naming it, before anything is read."""
    from unroll.tools.ewt import DEV_FILE

    data = app.corpus(tmp_path / "data")
    model_dir = tmp_path / "m"
    main = importlib.import_module(f"{app.module}.__main__").main
    assert main([*train_argv(app, data, model_dir), "--epochs", "1"]) == 0
    for device in ("/dev/zero", "/dev/null"):
        linked = tmp_path / device.replace("/", "_")
        linked.mkdir()
        (linked / DEV_FILE).symlink_to(device)
        status, _, err = predicted(app, predict_argv(app, linked, model_dir), capsys)
        assert status == 2, err
        assert err.strip().splitlines() == [
            f"python -m {app.module} {app.predict[0]}: error: {linked / DEV_FILE}: is a "
            f"device; expected a CoNLL-U file"], err
