"""Data-parallel training across processes: one communicator over MPI (CPU) or NCCL (GPU).

Launch the same script N times with ``mpiexec -n N python train.py`` (or
``mpirun``); each process calls :func:`init` and hands the communicator to its
:class:`~unroll.train.solver.Solver`, which broadcasts the params from rank 0 and
sums the gradients of every rank in one all-reduce before each update (its
:class:`~unroll.train.solver_callbacks.AllReduce` callback). Run
without a launcher, :func:`init` gives a communicator of size 1 and the same
script trains alone; mpi4py is imported only when a launcher started us.

A rank that raises ends the job on every rank: the others would otherwise
wait forever in the next all-reduce. Uncaught exceptions do this through
``sys.excepthook``; code that turns errors into an exit status wraps its work
in ``with comm:`` so that a failure inside still ends every rank.

>>> comm = init()  # not under mpiexec here
>>> comm.rank, comm.size
(0, 1)
>>> import numpy as np
>>> grads = np.ones(3)
>>> comm.allreduce_sum(grads)  # in place; the identity for one process
>>> grads
array([1., 1., 1.])
"""

from __future__ import annotations

import functools
import os
import sys
import traceback

from unroll.engine.backend import get_array_module, nccl_module

__all__ = ["Comm", "MPIComm", "NCCLComm", "init", "launched"]

#: environment variables by which MPI launchers tell a process its rank
#: (MPICH/Intel MPI hydra, Open MPI, PMIx-based launchers such as Slurm's)
LAUNCH_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


class Comm:
    """One process alone (size 1): every collective leaves its arguments as they are.

    The base of the MPI and NCCL communicators, and the interface the Solver
    drives: ``rank``, ``size``, in-place ``allreduce_sum`` and ``broadcast`` of
    one contiguous array, ``sum`` of a Python float, ``barrier`` and ``abort``.
    ``device`` is where the arrays it reduces must live (None: anywhere).
    """

    rank = 0
    size = 1
    device: str | None = None

    def allreduce_sum(self, array) -> None:
        """Replace ``array`` (contiguous) by its elementwise sum over all ranks."""

    def broadcast(self, array, root: int = 0) -> None:
        """Overwrite ``array`` (contiguous) on every rank with rank ``root``'s values."""

    def sum(self, value: float) -> float:
        """The sum of ``value`` over all ranks."""
        return value

    def barrier(self) -> None:
        """Wait until every rank has called it."""

    def abort(self, message: str, code: int = 1) -> None:
        """End every rank of the job, after printing ``message``; alone, does nothing."""

    def __enter__(self) -> Comm:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None or self.size == 1:
            return
        if kind is SystemExit and value.code in (None, 0):
            return
        if kind is not SystemExit:
            traceback.print_exception(kind, value, tb)
        self.abort(_failure(self, kind, value))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


class MPIComm(Comm):
    """Ranks of an MPI communicator (``mpi4py``), on NumPy arrays."""

    device = "cpu"

    def __init__(self, mpi_comm):
        self.mpi = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()

    def allreduce_sum(self, array) -> None:
        from mpi4py import MPI

        self.mpi.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)

    def broadcast(self, array, root: int = 0) -> None:
        self.mpi.Bcast(array, root=root)

    def sum(self, value: float) -> float:
        return self.mpi.allreduce(float(value))

    def barrier(self) -> None:
        self.mpi.Barrier()

    def abort(self, message: str, code: int = 1) -> None:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
        self.mpi.Abort(code)


class NCCLComm(MPIComm):
    """One rank per GPU: arrays over NCCL (``cupy.cuda.nccl``), the rest over MPI.

    Each rank uses the GPU numbered by its rank among the ranks of its host.
    """

    device = "gpu"

    def __init__(self, mpi_comm):
        super().__init__(mpi_comm)
        from mpi4py import MPI

        cupy, nccl = get_array_module("gpu"), nccl_module()
        local_rank = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
        uid = mpi_comm.bcast(nccl.get_unique_id() if self.rank == 0 else None, root=0)
        self._cupy, self._lib = cupy, nccl
        self.nccl = nccl.NcclCommunicator(self.size, uid, self.rank)

    def _nccl_type(self, array) -> int:
        types = {"float32": self._lib.NCCL_FLOAT32, "float64": self._lib.NCCL_FLOAT64,
                 "float16": self._lib.NCCL_FLOAT16}
        if array.dtype.name not in types:
            raise TypeError(f"NCCL reduces {sorted(types)} arrays, found {array.dtype}")
        return types[array.dtype.name]

    def allreduce_sum(self, array) -> None:
        stream = self._cupy.cuda.get_current_stream().ptr
        self.nccl.allReduce(array.data.ptr, array.data.ptr, array.size, self._nccl_type(array),
                            self._lib.NCCL_SUM, stream)

    def broadcast(self, array, root: int = 0) -> None:
        stream = self._cupy.cuda.get_current_stream().ptr
        self.nccl.bcast(array.data.ptr, array.size, self._nccl_type(array), root, stream)


def launched() -> bool:
    """True when an MPI launcher (``mpiexec``, ``mpirun``, ``srun``) started this process."""
    return any(name in os.environ for name in LAUNCH_VARIABLES)


@functools.cache
def init(device: str = "cpu") -> Comm:
    """The communicator of this job: MPI ranks under a launcher, else one process alone.

    ``device`` is the device the params live on: "cpu" reduces NumPy arrays
    over MPI, "gpu" CuPy arrays over NCCL, one GPU per rank. Calling it again
    returns the same communicator. Under a launcher with more than one rank,
    an uncaught exception on any rank prints its traceback and ends every rank.

    For example, ``mpiexec -n 2 python -c "import unroll.train.distributed as d; print(d.init())"``
    prints ``MPIComm(rank=0, size=2)`` and ``MPIComm(rank=1, size=2)``.
    """
    if device not in ("cpu", "gpu"):
        raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'gpu'")
    if not launched():
        return Comm()
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError(
            "this process was started by an MPI launcher, but mpi4py is not installed; "
            "install it with: pip install 'unroll[mpi]'"
        ) from None
    comm = NCCLComm(MPI.COMM_WORLD) if device == "gpu" else MPIComm(MPI.COMM_WORLD)
    if comm.size > 1:
        _abort_on_uncaught(comm)
    return comm


def _failure(comm: Comm, kind, value) -> str:
    return (f"unroll.train.distributed: rank {comm.rank} of {comm.size} failed "
            f"({kind.__name__}: {value}); ending every rank")


def _abort_on_uncaught(comm: Comm) -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        comm.abort(_failure(comm, kind, value))

    sys.excepthook = hook
