"""The model folder: what `train` writes, in which order, and who may write it.

Files, each written atomically (a temp file renamed into place)::

    features.json, config.json         first, once: vocabularies and sizes (the
                                         application's files: see ModelFiles)
    <cell>.prototxt.j2                 a step template given as a path (copied in)
    snapshot_iter_N.caffemodel         per epoch: raw params,
    snapshot_iter_N.solverstate          solver state,
    snapshot_iter_N.average.caffemodel   averaged params (to resume exactly), where the
                                         trainer averages (the tagger; not the lemmatizer)
    snapshot_iter_N.carried.caffemodel   recurrent state carried into the next epoch, where
                                         the application carries one (truncated BPTT)
    log.json                           per epoch, after the snapshot
    last.caffemodel                    per epoch: the averaged params (or the raw ones)
    best.caffemodel                    the same, of the best dev epoch
    curve.png                          the loss and accuracy plot
    train.lock                         locked while a trainer runs

``log.json`` is the commit point: its entry of an epoch names that epoch's
snapshot files and holds the SHA-256 of them, of the ``last`` and ``best``
weights as they are after the epoch, and of every file the application
declared (:class:`ModelFiles`: its config, its vocabularies), so that none of
them can be changed or swapped unnoticed; the previous epoch's snapshot is
deleted only after it. So a kill at any instant leaves the files
``log.json`` names in place, ``--resume`` continues from its last epoch
(first finishing a ``last``/``best`` copy that the kill interrupted), and
files of an epoch it does not name (a killed one's) are removed on the next
run, with stale temp files. Until then ``last`` and ``best`` may still hold
the previous epoch's weights, which their checksum in the previous entry
vouches for.

Nothing read from the folder is trusted: only regular files are read (a
FIFO, a device or a link to one is refused without waiting on it), the JSON
files are bounded and schema-checked (:mod:`unroll.core.json_files`), every
name in them must be exactly one the trainer writes there (a plain file name,
never a path, never a link leading out of the folder), and only such names
are ever removed or replaced. ``--resume`` continues a complete, consistent
folder or refuses, saying what is wrong; it never starts over in a folder
that holds a model. A folder that holds none yet (its trainer was killed
before the first epoch was logged) is tidied and trained from epoch 1.

Every trainer keeps its folder through this module: :func:`claimed` to hold it,
:func:`commit_epoch` to write an epoch, :func:`restore_solver` to continue one;
:func:`read_json` (:func:`read_declared`: all of them) and :func:`verified` read it
back, and :func:`load_trained` is what every command that reads a trained folder
calls. Each application declares its files once, as a :class:`ModelFiles`: its JSON
files with their schemas, and its log schema, built by :func:`epoch_log_schema` from
the folder's own fields (:data:`ENTRY_PROPERTIES`: ``epoch``, ``iter``,
``snapshot``, ``sha256``; ``average`` where it averages) and its own.

>>> files = ModelFiles(
...     epoch_log_schema({"dev_accuracy": json_files.finite(1)}, required=["dev_accuracy"]),
...     json={CONFIG: {"type": "object", "properties": {"hidden": json_files.count(64)}}})
>>> sorted(files.log_schema["items"]["required"])
['dev_accuracy', 'epoch', 'iter', 'sha256', 'snapshot']
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from unroll.core import json_files
from unroll.core.atomic import remove_stale_temps, write_atomic
from unroll.core.errors import FileFormatError, NetError
from unroll.core.proto import NetParameter, SolverState, read_binary
from unroll.train.solver import SolverError

__all__ = ["CHECKPOINTS", "CONFIG", "CURVE", "ENTRY_PROPERTIES", "FEATURES", "LOCK", "LOG",
           "SNAPSHOT_NAME", "SNAPSHOT_PREFIX", "TRAINER_NAMES", "WEIGHT_SUFFIXES", "ModelFiles",
           "ModelFolderError", "carried_name", "checkpoint_checksums", "checkpoint_name",
           "claimed", "commit_epoch", "committed_weights", "epoch_log_schema", "holds_model",
           "inside", "load_checkpoint", "load_trained", "model_files", "options_differ",
           "read_declared", "read_json", "read_log", "restore_solver", "resumable_log",
           "resume_error", "settings_differ", "sha256", "snapshot_files", "snapshot_names",
           "trained_log", "verified", "write_json"]

LOG = "log.json"
CONFIG = "config.json"
FEATURES = "features.json"
LOCK = "train.lock"
CURVE = "curve.png"
SNAPSHOT_PREFIX = "snapshot"
#: the weights `tag` and `evaluate` can load, by --checkpoint name
CHECKPOINTS = ("best", "last")
#: the names the trainer gives its own files, and the suffixes of its weights
TRAINER_NAMES = (LOG, CONFIG, FEATURES, CURVE, LOCK)
WEIGHT_SUFFIXES = (".caffemodel", ".solverstate")
#: the names of the snapshot files the trainer writes (N: the solver's iteration)
SNAPSHOT_NAME = re.compile(
    r"snapshot_iter_[0-9]+\.(?:solverstate|caffemodel|average\.caffemodel|carried\.caffemodel)")


#: the fields of a log.json entry that the folder itself reads (``stopped``: a run that
#: --max-minutes ended); an application adds its own through :func:`epoch_log_schema`
ENTRY_PROPERTIES = {
    "epoch": {"type": "integer", "minimum": 1, "maximum": 1 << 20,
              "description": "an epoch number >= 1"},
    "iter": {"type": "integer", "minimum": 0, "maximum": 1 << 53,
             "description": "an iteration count >= 0"},
    "snapshot": {"type": "string", "pattern": r"^snapshot_iter_[0-9]{1,16}\.solverstate$",
                 "description": "a file name snapshot_iter_N.solverstate"},
    "seed": {"type": "integer", "minimum": 0, "maximum": (1 << 63) - 1,
             "description": "an integer >= 0"},
    "sha256": {"type": "object", "description": "an object {file name: SHA-256}",
               "maxProperties": 64, "additionalProperties": json_files.SHA256_HEX},
    "stopped": {"type": "string", "maxLength": 200,
                "pattern": r"^stopped by --max-minutes after [0-9]+ of [0-9]+ epochs$",
                "description": "the --max-minutes message"},
}
#: the field naming an epoch's averaged weights, in the log of a trainer that averages
_AVERAGE = {"average": {"type": "string",
                        "pattern": r"^snapshot_iter_[0-9]{1,16}\.average\.caffemodel$",
                        "description": "a file name snapshot_iter_N.average.caffemodel"}}
#: the field naming an epoch's carried recurrent state, in the log of an application that
#: carries state from one batch to the next (see :func:`commit_epoch`)
_CARRIED = {"carried": {"type": "string",
                        "pattern": r"^snapshot_iter_[0-9]{1,16}\.carried\.caffemodel$",
                        "description": "a file name snapshot_iter_N.carried.caffemodel"}}


def epoch_log_schema(properties: dict, required: list[str], averaged: bool = False,
                     carried: bool = False) -> dict:
    """The schema of a log.json whose entries hold :data:`ENTRY_PROPERTIES` and
    ``properties`` (an application's own fields) and no other key; ``epoch``, ``iter``,
    ``snapshot``, ``sha256`` and the names in ``required`` must be present, and
    ``average`` where the trainer ``averaged`` its weights and ``carried`` where it
    ``carried`` recurrent state (see :func:`commit_epoch`)."""
    entry = {
        "type": "object", "description": "an epoch record {...}", "additionalProperties": False,
        "required": ["epoch", "iter", "snapshot", "sha256", *required,
                     *(["average"] if averaged else []), *(["carried"] if carried else [])],
        "properties": (ENTRY_PROPERTIES | (_AVERAGE if averaged else {})
                       | (_CARRIED if carried else {}) | properties),
    }
    return {"type": "array", "description": "a list [...]", "maxItems": 1 << 20, "items": entry}


class ModelFolderError(ValueError):
    """A model folder that cannot be used as asked: names the folder and what to do."""


@dataclass(frozen=True)
class ModelFiles:
    """What one application keeps in its model folders besides weights, declared once.

    ``log_schema`` checks its log.json (see :func:`epoch_log_schema`); ``json``
    maps each of its own JSON files (``config.json``, ``features.json``, ...)
    to its schema. The trainer writes those files before the first epoch;
    every log entry then holds their SHA-256, and they are read back only
    through :func:`read_json`, which checks the bytes against it.
    """

    log_schema: dict
    json: Mapping[str, dict] = field(default_factory=dict)

    def __post_init__(self):
        for name in self.json:
            if (Path(name).name != name or name in (LOG, LOCK, CURVE) or "\\" in name
                    or Path(name).suffix in WEIGHT_SUFFIXES or SNAPSHOT_NAME.fullmatch(name)):
                raise ValueError(f"ModelFiles: {name!r} cannot be an application's file: "
                                 f"a plain file name other than the trainer's own is needed")


def checkpoint_name(checkpoint: str) -> str:
    return f"{checkpoint}.caffemodel"


def write_json(path: Path, value) -> None:
    write_atomic(path, json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8"))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snapshot_names(iteration: int) -> tuple[str, str, str]:
    """(solverstate, caffemodel, average) names of the snapshot at ``iteration``."""
    base = f"{SNAPSHOT_PREFIX}_iter_{iteration}"
    return f"{base}.solverstate", f"{base}.caffemodel", f"{base}.average.caffemodel"


def inside(model_dir: Path, name: str) -> Path:
    """``model_dir / name``, where ``name`` is a plain file name (no folder, no ``..``) and
    the entry, if a symlink, does not lead out of ``model_dir``: a FileFormatError else."""
    path = Path(model_dir) / name
    if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
        raise FileFormatError(model_dir, f"{name!r:.80} is not a file name in the folder")
    if path.is_symlink() and (Path(os.path.realpath(path)).parent
                              != Path(os.path.realpath(model_dir))):
        raise FileFormatError(path, "is a symlink leading out of the model folder")
    return path


def read_log(model_dir: Path, files: ModelFiles) -> list[dict]:
    """The epochs logged in ``model_dir`` ([] where there is no log.json).

    Every entry is checked against ``files.log_schema``, numbered 1, 2, ... in
    order, and names the snapshot files of its own iteration; its checksums
    cover exactly those, the ``last`` and ``best`` weights and the files of
    ``files.json``. Anything else is a FileFormatError naming the file, the
    entry and the field.
    """
    path = inside(model_dir, LOG)
    if not os.path.lexists(path):
        return []
    log = json_files.read_checked(path, files.log_schema)
    for k, entry in enumerate(log):
        state, weights, average = snapshot_names(entry["iter"])
        if entry["epoch"] != k + 1:
            raise FileFormatError(path, f"[{k}].epoch is {entry['epoch']}; entry {k} must be "
                                        f"epoch {k + 1}")
        if k and entry["iter"] < log[k - 1]["iter"]:
            raise FileFormatError(path, f"[{k}].iter {entry['iter']} is below the previous "
                                        f"entry's {log[k - 1]['iter']}")
        for key, name in (("snapshot", state), ("average", average),
                          ("carried", carried_name(entry["iter"]))):
            if key in entry and entry[key] != name:
                raise FileFormatError(path, f"[{k}].{key} must be {name!r} (its iteration's "
                                            f"snapshot), found {entry[key]!r:.60}")
        expected = (snapshot_files(entry) | set(map(checkpoint_name, CHECKPOINTS))
                    | set(files.json))
        if set(entry["sha256"]) != expected:
            raise FileFormatError(path, f"[{k}].sha256 must hold the checksums of exactly "
                                        f"{sorted(expected)}")
    return log


def carried_name(iteration: int) -> str:
    """The name of the carried state's file of the snapshot at ``iteration``."""
    return f"{SNAPSHOT_PREFIX}_iter_{iteration}.carried.caffemodel"


def snapshot_files(entry: dict) -> set[str]:
    """The names of the snapshot files of one (checked) log entry: the solver's two, and the
    average and the carried state where the entry names them."""
    state, weights, average = snapshot_names(entry["iter"])
    return ({state, weights} | ({average} if "average" in entry else set())
            | ({carried_name(entry["iter"])} if "carried" in entry else set()))


def committed_weights(entry: dict) -> str:
    """The snapshot file that the entry's ``last`` (and a new ``best``) are copies of: the
    average where there is one, else the solver's weights."""
    return entry.get("average") or snapshot_names(entry["iter"])[1]


def verified(path: Path, expected: str | set) -> bytes:
    """The bytes of ``path`` if their SHA-256 is (one of) ``expected``, else a FileFormatError."""
    data = json_files.read_bytes(path, limit=1 << 40)
    accepted = {expected} if isinstance(expected, str) else expected
    if sha256(data) not in accepted:
        raise FileFormatError(path, f"its checksum is not the one {LOG} records: the file "
                                    f"is damaged or was replaced")
    return data


def read_json(model_dir: Path, files: ModelFiles, name: str, log: list[dict]):
    """The value of the application's JSON file ``name`` (declared in ``files``): its bytes
    the ones the last entry of ``log`` (:func:`read_log`) records, where there is one, then
    bounded and schema-checked; a FileFormatError naming the file else."""
    path = inside(model_dir, name)
    data = json_files.read_bytes(path)
    if log and sha256(data) != log[-1]["sha256"][name]:
        raise FileFormatError(path, f"its checksum is not the one {LOG} records: the file "
                                    f"was changed or replaced since training wrote it")
    return json_files.parse_checked(path, data, files.json[name])


def read_declared(model_dir: Path, files: ModelFiles, log: list[dict]) -> dict:
    """{name: value} of every JSON file ``files`` declares, each read by :func:`read_json`."""
    return {name: read_json(model_dir, files, name, log) for name in files.json}


def trained_log(model_dir: Path, files: ModelFiles, what: str, module: str) -> list[dict]:
    """The log of a trained folder (:func:`read_log`), or a ModelFolderError saying that
    ``model_dir`` holds no trained ``what`` and how to train one with ``python -m module``."""
    model_dir = Path(model_dir)
    log = read_log(model_dir, files) if model_dir.is_dir() else []
    if not log:
        held = "no such folder" if not model_dir.is_dir() else f"{LOG} names no finished epoch"
        raise ModelFolderError(f"{model_dir} holds no trained {what} ({held}); train one with "
                               f"`python -m {module} train --model-dir {model_dir}`")
    return log


def load_trained(model_dir: Path, files: ModelFiles, build, *, what: str, module: str,
                 checkpoint: str = "best"):
    """The model of a trained folder, or refuse (:func:`trained_log`): ``build`` makes it
    from the values of the application's JSON files (:func:`read_declared`: {name: value},
    checked against log.json), then the ``checkpoint`` weights go into its ``train_model``
    (:func:`load_checkpoint`).

    >>> load_trained("no/such/dir", ModelFiles(epoch_log_schema({}, [])), dict, what="tagger",
    ...              module="examples.pos_tagging")
    Traceback (most recent call last):
    unroll.train.model_folder.ModelFolderError: no/such/dir holds no trained tagger (no such \
folder); train one with `python -m examples.pos_tagging train --model-dir no/such/dir`
    """
    model_dir = Path(model_dir)
    log = trained_log(model_dir, files, what, module)
    model = build(read_declared(model_dir, files, log))
    load_checkpoint(model.train_model, model_dir, log, checkpoint)
    return model


def load_checkpoint(model, model_dir: Path, log: list[dict], checkpoint: str) -> None:
    """Copy the ``checkpoint`` weights (best, last) of ``model_dir`` into ``model`` (a
    BucketedModel, a TreeModel: what has ``copy_from``), their bytes the ones ``log``
    records; weights that do not fit the model are a NetError naming the file."""
    path = inside(model_dir, checkpoint_name(checkpoint))
    # a kill between a weight file and log.json leaves the previous epoch's in place
    data = verified(path, checkpoint_checksums(log, checkpoint))
    try:
        model.copy_from(NetParameter.FromString(data), strict=True)
    except NetError as e:
        raise NetError(f"{path}: {e}") from None


def checkpoint_checksums(log: list, checkpoint: str) -> set[str]:
    """The SHA-256 values ``checkpoint`` may have: the last epoch's, or the one before's
    where a kill came between log.json and the copy (see the module)."""
    name = checkpoint_name(checkpoint)
    return {entry["sha256"][name] for entry in log[-2:]}


def model_files(model_dir: Path, files: ModelFiles | None = None) -> list[Path]:
    """The files of a trained (or training) model in ``model_dir``: any entry by such a
    name (the folder's own, or one ``files`` declares) that is not a folder, be it a
    symlink, a FIFO or a broken link."""
    names = {LOG, CONFIG, FEATURES, CURVE} | set(files.json if files else ())
    return sorted(p for p in model_dir.iterdir() if not _is_dir(p) and (
        p.name in names or p.suffix in WEIGHT_SUFFIXES))


def holds_model(held: list[Path]) -> bool:
    """Whether ``held`` (:func:`model_files`) is a model: a log.json or weights other than
    an unlogged snapshot. The rest (the JSON files, a plot, a snapshot) is what a trainer
    killed before its first epoch was logged leaves."""
    return any(p.name == LOG or (p.suffix in WEIGHT_SUFFIXES
                                 and not SNAPSHOT_NAME.fullmatch(p.name)) for p in held)


def _is_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def resume_error(model_dir: Path, problem: str) -> ModelFolderError:
    """The refusal of --resume: what is wrong, and the way out."""
    return ModelFolderError(f"--resume: {problem}; {model_dir} cannot be continued: pass "
                            f"--overwrite to start over (deleting its model), or use another "
                            f"--model-dir")


def resumable_log(model_dir: Path, files: ModelFiles) -> list[dict]:
    """The log of a folder that --resume can continue, after finishing an interrupted commit.

    The folder must hold the application's files and a log naming at least one
    epoch, whose snapshot files and the application's files are present with
    the checksums the log records; else a ModelFolderError says what is wrong.
    """
    for name in (*files.json, LOG):
        if not os.path.lexists(model_dir / name):
            held = ", ".join(p.name for p in model_files(model_dir)[:3])
            raise resume_error(model_dir, f"{model_dir / name} is missing (the folder holds "
                                          f"{held})")
    try:
        log = read_log(model_dir, files)
        if not log:
            raise resume_error(model_dir, f"{model_dir / LOG} names no finished epoch")
        entry = log[-1]
        for name in sorted(snapshot_files(entry)) + sorted(files.json):
            path = inside(model_dir, name)
            if not os.path.lexists(path):
                raise resume_error(model_dir, f"{path}, which {LOG} names, is missing")
            verified(path, entry["sha256"][name])
        _finish_commit(model_dir, log)
    except (FileFormatError, OSError) as e:
        raise resume_error(model_dir, str(e)) from None
    return log


def _finish_commit(model_dir: Path, log: list) -> None:
    """Copy the last epoch's committed weights (its average) into ``last``/``best`` where a
    kill left them behind the log; a checkpoint that matches neither is damaged, and
    refused."""
    entry = log[-1]
    source = committed_weights(entry)
    average = entry["sha256"][source]
    for checkpoint in CHECKPOINTS:
        name = checkpoint_name(checkpoint)
        path = inside(model_dir, name)
        if entry["sha256"][name] == average and (
            not os.path.lexists(path) or not path.is_file() or _sha256_of(path) != average
        ):
            write_atomic(path, verified(inside(model_dir, source), average))
        else:
            verified(path, entry["sha256"][name])


def _sha256_of(path: Path) -> str:
    return sha256(json_files.read_bytes(path, limit=1 << 40))


@contextlib.contextmanager
def claimed(model_dir: Path, resume: bool, overwrite: bool, files: ModelFiles):
    """Hold ``model_dir`` for one trainer: create it, lock it, tidy it, check it may be used.

    Refuses a folder that already holds a model unless ``resume`` (continue it:
    see :func:`resumable_log`) or ``overwrite`` (delete its model files first),
    and a folder another trainer holds. A folder whose files are only what a
    trainer killed before its first logged epoch leaves (see :func:`holds_model`)
    holds no model: those files are removed. ``resume`` on a folder without a
    model starts from epoch 1, saying so. Removes temp files and snapshots that
    a killed run left, never one that the log names.
    """
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise ModelFolderError(f"--model-dir {model_dir} is a file; expected a folder")
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ModelFolderError(f"--model-dir {model_dir}: a part of this path is a file, "
                               f"not a folder") from None
    with _locked(model_dir):
        remove_stale_temps(model_dir)
        held = model_files(model_dir, files)
        log = []
        if resume and not holds_model(held):
            print(f"--resume: {model_dir} holds no finished epoch yet; starting from epoch 1",
                  file=sys.stderr)
        if held and not holds_model(held):
            for path in held:
                path.unlink()  # a symlink goes, never what it points to
        elif held and resume:
            log = resumable_log(model_dir, files)
        elif held:
            if not overwrite:
                raise ModelFolderError(
                    f"{model_dir} already holds a model ({', '.join(p.name for p in held[:3])}"
                    f"{', ...' if len(held) > 3 else ''}); pass --resume to continue it or "
                    f"--overwrite to replace it, or choose another --model-dir"
                )
            for path in held:
                path.unlink()
        kept = snapshot_files(log[-1]) if log else set()
        for path in model_dir.iterdir():
            if SNAPSHOT_NAME.fullmatch(path.name) and path.name not in kept and not _is_dir(path):
                path.unlink()
        yield model_dir


def settings_differ(model_dir: Path, asked: dict, has: dict) -> None:
    """Refuse to resume with settings (``asked``, those given) that differ from the folder's
    (``has``), naming each."""
    conflicts = [f"{k} {v!r} (the folder has {has.get(k)!r})"
                 for k, v in asked.items() if has.get(k) != v]
    if conflicts:
        raise ModelFolderError(
            f"--resume: {model_dir} was trained with other settings; asked for "
            f"{', '.join(conflicts)}: drop these options, or train a new --model-dir"
        )


def options_differ(model_dir: Path, recorded: dict, given: dict) -> None:
    """Refuse to resume with training options (``given``: {option: value} as this run
    would use them) that differ from those the folder's log ``recorded``, naming each; an
    option the log does not hold (an application that records it since) is not checked.

    >>> options_differ(Path("m"), {"--lr": 0.01}, {"--lr": 0.01, "--lr-decay": 0.9})
    """
    conflicts = [f"{k} {recorded[k]!r}, given {k} {v!r}"
                 for k, v in given.items() if k in recorded and recorded[k] != v]
    if conflicts:
        raise ModelFolderError(f"--resume: {model_dir} was trained with {'; with '.join(conflicts)}"
                               f": drop the option (the folder's is taken), or train a new "
                               f"--model-dir")


def commit_epoch(model_dir: Path, solver, log: list, result: dict, is_best: bool,
                 averaged: bytes | None = None, carried: bytes | None = None, *,
                 files: ModelFiles) -> None:
    """Write an epoch's files in the order this module relies on; log.json commits them.

    ``solver.snapshot`` writes the weights and solver state; ``averaged``
    (serialized weights) is written beside them where the trainer averages,
    and is what ``last`` (and, if ``is_best``, ``best``) get; else they get
    the solver's weights. ``carried`` (serialized recurrent state, where the application
    carries one across batches) is written beside them too, to resume from.
    ``result`` (the epoch's record) gains the names and checksums (those of the
    application's ``files`` too) and is appended to ``log``; the previous epoch's
    snapshot goes last.
    """
    weights, state = solver.snapshot(model_dir / SNAPSHOT_PREFIX)
    checksums = {path.name: sha256(path.read_bytes()) for path in (weights, state)}
    result["snapshot"] = state.name
    if averaged is not None:
        average = state.with_suffix(".average.caffemodel")
        write_atomic(average, averaged)
        checksums[average.name] = sha256(averaged)
        result["average"] = average.name
    if carried is not None:
        name = carried_name(solver.iter)
        write_atomic(model_dir / name, carried)
        checksums[name] = sha256(carried)
        result["carried"] = name
    kept = averaged if averaged is not None else weights.read_bytes()
    checksums["last.caffemodel"] = sha256(kept)
    checksums["best.caffemodel"] = (checksums["last.caffemodel"] if is_best
                                    else log[-1]["sha256"]["best.caffemodel"])
    for name in files.json:
        checksums[name] = sha256(json_files.read_bytes(inside(model_dir, name)))
    result["sha256"] = checksums
    previous = snapshot_files(log[-1]) if log else set()
    log.append(result)
    write_json(model_dir / LOG, log)
    write_atomic(model_dir / "last.caffemodel", kept)
    if is_best:
        write_atomic(model_dir / "best.caffemodel", kept)
    for name in previous - snapshot_files(result):
        (model_dir / name).unlink(missing_ok=True)


def restore_solver(solver, model_dir: Path, entry: dict) -> None:
    """The solver (iteration, history) and the weights of the epoch ``entry`` logs, from
    files whose checksums :func:`claimed` checked; the state may name no weights but its
    own. Weights that do not fit the net refuse the resume."""
    state = inside(model_dir, entry["snapshot"])
    weights = snapshot_names(entry["iter"])[1]
    try:
        learned = read_binary(state, SolverState, "solver state").learned_net
    except FileFormatError as e:
        raise resume_error(model_dir, str(e)) from None
    if learned != weights:
        raise resume_error(model_dir, f"{state}: its learned_net is {learned!r:.80}; "
                                      f"the trainer writes {weights!r}")
    try:
        try:
            solver.restore(state)
        except NetError as e:  # the solver hands the weights over without their file name
            raise NetError(f"{model_dir / weights}: {e}") from None
    except (NetError, SolverError, FileFormatError) as e:
        raise resume_error(model_dir, str(e)) from None


@contextlib.contextmanager
def _locked(model_dir: Path):
    """An exclusive lock on ``model_dir/train.lock``; the OS drops it when the process dies."""
    import fcntl

    lock = model_dir / LOCK
    try:  # O_NOFOLLOW: a train.lock that links elsewhere is never truncated
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError:
        if lock.is_symlink():
            raise ModelFolderError(f"{lock} is a symlink; remove it (a trainer makes its own "
                                   f"lock file)") from None
        raise
    try:
        if os.fstat(fd).st_nlink > 1:  # a hard link: truncating it would truncate elsewhere
            raise ModelFolderError(f"{lock} is a hard link to another file; remove it (a "
                                   f"trainer makes its own lock file)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ModelFolderError(
                f"{model_dir} is in use by another training (it holds {lock}); "
                f"wait for it to end or use another --model-dir"
            ) from None
        # writing now, not after an epoch of training, finds a read-only or full disk
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        yield
    finally:
        os.close(fd)
