"""The Trainer under ``mpiexec -n 2``: every rank's carried state in the snapshot, resumed exactly.

docs/design.md, 10. Training. The tests launch this file as the MPI program
(:func:`worker`) on tests/train/test_trainer.py's tiny application, whose ranks
take different batches and so carry different states.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import limit
from tests.train.test_trainer import Regression, final_state, fit
from unroll.core.proto import NetParameter, array_from_blob_proto
from unroll.train import model_folder as folder

ROOT = Path(__file__).resolve().parents[2]


def _mpiexec() -> str | None:
    """mpiexec beside this Python (the mpich wheel's), else on PATH."""
    return shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which(
        "mpiexec")


def _mpi_ready() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return _mpiexec() is not None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not _mpi_ready(), reason="needs mpi4py and mpiexec: pip install -e '.[mpi]'")]


def mpiexec(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run([_mpiexec(), "-n", "2", sys.executable, __file__, *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=limit(300))


def test_two_ranks_resume_with_each_ranks_carried_state(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for run in (mpiexec(whole, 3), mpiexec(resumed, 1), mpiexec(resumed, 3, "--resume")):
        assert run.returncode == 0, run.stderr
    assert final_state(resumed) == final_state(whole)
    entry = folder.read_log(whole, Regression.files)[-1]
    carried = NetParameter.FromString((whole / entry["carried"]).read_bytes())
    rows = array_from_blob_proto(carried.layer[0].blobs[0])
    assert rows.shape == (2, 3) and (rows[0] != rows[1]).all()  # one row a rank
    # one process cannot carry on two ranks' states
    with pytest.raises(folder.ModelFolderError, match="another number of ranks than 1"):
        fit(Regression(), whole, resume=True, epochs=4)


def worker(argv) -> None:
    model_dir, epochs, *resume = argv
    fit(Regression(), Path(model_dir), epochs=int(epochs), resume=bool(resume))


if __name__ == "__main__":
    worker(sys.argv[1:])
