"""A solver's snapshot files, as Caffe writes them: a .caffemodel and a .solverstate.

``{prefix}_iter_{N}.caffemodel`` is a binary NetParameter with the weights;
``{prefix}_iter_{N}.solverstate`` a binary SolverState: ``iter``, the model's
file name (``learned_net``), the history blobs in Caffe's order (slot 0 of
every param, then slot 1: Adam's and AdaDelta's 2 x N) and ``current_step``
(multistep's position). History is stored in the net's dtype (float64 in
``double_data``), so restoring and continuing gives bit-identical weights to
an uninterrupted run (docs/design.md, Solver).

>>> snapshot_paths("runs/tagger", 1000)
(PosixPath('runs/tagger_iter_1000.caffemodel'), PosixPath('runs/tagger_iter_1000.solverstate'))
"""

from __future__ import annotations

import os
from pathlib import Path

from unroll.core.atomic import write_files_atomic
from unroll.core.proto import (
    SolverState,
    array_from_blob_proto,
    blob_proto_from_array,
    read_binary,
)
from unroll.engine.backend import to_numpy
from unroll.train.solver_param import SolverError

__all__ = ["find_model", "history_values", "read_state", "snapshot_paths", "write_snapshot"]


def snapshot_paths(prefix, iteration: int) -> tuple[Path, Path]:
    """The (caffemodel, solverstate) paths of a snapshot at ``iteration``."""
    if not prefix:
        raise SolverError("snapshot needs a prefix: pass one or set 'snapshot_prefix'")
    base = f"{os.fspath(prefix)}_iter_{iteration}"
    return Path(base + ".caffemodel"), Path(base + ".solverstate")


def write_snapshot(model_path: Path, state_path: Path, iteration: int, current_step: int,
                   history, model: bytes) -> None:
    """Both files, each written to a temp file and renamed into place (all or nothing)."""
    state = SolverState(iter=iteration, learned_net=model_path.name, current_step=current_step)
    for h in history:
        state.history.add().CopyFrom(blob_proto_from_array(to_numpy(h)))
    write_files_atomic([(model_path, model), (state_path, state.SerializeToString())])


def read_state(state_path: Path) -> SolverState:
    """The SolverState in ``state_path``, checked to be one."""
    if state_path.name.endswith(".h5"):
        raise SolverError(f"{state_path}: HDF5 solver states are not supported")
    state = read_binary(state_path, SolverState, "solver state")
    if not state.HasField("iter") or state.iter < 0:
        raise SolverError(f"{state_path}: not a solver state (no valid 'iter' field)")
    return state


def history_values(state: SolverState, state_path: Path, params, slots: int, kind: str) -> list:
    """The state's history blobs as arrays shaped as ``params``' (Caffe's order), checked
    to be ``slots`` per param of the right sizes."""
    if len(state.history) != slots * len(params):
        raise SolverError(
            f"{state_path}: holds {len(state.history)} history blobs; a {kind} solver "
            f"over {len(params)} learnable params needs {slots * len(params)} (was it "
            f"written by another solver type or for another net?)"
        )
    values = []
    for k, bp in enumerate(state.history):
        p = params[k % len(params)]
        value = array_from_blob_proto(bp)
        if value.size != p.blob.data.size:
            raise SolverError(
                f"{state_path}: history blob {k} has shape {value.shape}; learnable param "
                f"'{p.name}' has shape {p.blob.data.shape}"
            )
        values.append(value.reshape(p.blob.data.shape))
    return values


def find_model(state_path: Path, learned_net: str) -> Path:
    """The caffemodel a state names: in the state's folder, or (as Caffe writes it)
    relative to the working directory."""
    named = Path(learned_net)
    candidates = [named] if named.is_absolute() else [
        state_path.parent / named, named, state_path.parent / named.name
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{state_path}: its learned_net '{learned_net}' is not at "
        f"{', '.join(str(c) for c in dict.fromkeys(candidates))}"
    )
