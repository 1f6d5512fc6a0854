"""unroll.train.distributed in one process, and the sharded BucketSampler (multi-rank: _mpi)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import unroll.train.distributed
from unroll.engine.net import Net
from unroll.train.bucketing import BucketSampler
from unroll.train.distributed import Comm, init, launched
from unroll.train.solver import Solver, SolverError


@st.composite
def sharded(draw):
    """(kwargs of a sampler, number of ranks) over random lengths and settings."""
    by_tokens = draw(st.booleans())
    kwargs = dict(
        lengths=draw(st.lists(st.integers(1, 40), min_size=1, max_size=150)),
        batch_size=draw(st.integers(1, 120) if by_tokens else st.integers(1, 20)),
        seed=draw(st.integers(0, 2**32)),
        by_tokens=by_tokens,
        shuffle=draw(st.booleans()),
        drop_last=draw(st.booleans()),
    )
    return kwargs, draw(st.integers(1, 6))


@given(sharded(), st.integers(0, 5))
def test_ranks_share_every_batch_of_an_epoch_once_in_equal_steps(case, epoch):
    kwargs, size = case
    alone = BucketSampler(**kwargs).epoch_batches(epoch)
    shards = [BucketSampler(**kwargs, rank=r, size=size).epoch_batches(epoch) for r in range(size)]
    steps = len(alone) // size
    assert [len(s) for s in shards] == [steps] * size
    assert all(len(BucketSampler(**kwargs, rank=r, size=size)) == steps for r in range(size))
    # step i of all ranks together is what one process with iter_size = size would see
    dealt = [shards[r][i] for i in range(steps) for r in range(size)]
    assert dealt == alone[: steps * size]
    assert len(alone) - len(dealt) < size  # only the remainder is left out


@pytest.mark.parametrize("rank, size", [(2, 2), (-1, 2), (0, 0)])
def test_bad_rank_or_size_is_an_error(rank, size):
    with pytest.raises(ValueError, match="rank|size"):
        BucketSampler([3, 4], rank=rank, size=size)


def test_without_a_launcher_init_is_one_process(monkeypatch):
    for name in unroll.train.distributed.LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not launched()
    init.cache_clear()
    comm = init()
    assert (comm.rank, comm.size) == (0, 1) and type(comm) is Comm
    grads, params = np.arange(4.0), np.ones(2)
    comm.allreduce_sum(grads)
    comm.broadcast(params)
    assert grads.tolist() == [0, 1, 2, 3] and params.tolist() == [1, 1]
    assert comm.sum(2.5) == 2.5
    with pytest.raises(ValueError, match="one process"), comm:  # alone, errors propagate
        raise ValueError("one process")


def test_a_launcher_without_mpi4py_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    init.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"pip install 'unroll\[mpi\]'"):
            init()
    finally:
        init.cache_clear()


class Recording(Comm):
    """Rank 1 of 2 that records what it would abort with."""

    rank, size = 1, 2
    aborted = None

    def abort(self, message, code=1):
        self.aborted = message


@pytest.mark.parametrize("error", [ValueError("bad batch"), SystemExit(2), KeyboardInterrupt()])
def test_a_failure_inside_the_comm_block_aborts_naming_the_rank(error):
    comm = Recording()
    with pytest.raises(type(error)), comm:
        raise error
    expected = f"unroll.train.distributed: rank 1 of 2 failed ({type(error).__name__}"
    assert comm.aborted.startswith(expected)


@pytest.mark.parametrize("code", [None, 0])
def test_a_clean_exit_inside_the_comm_block_aborts_nothing(code):
    comm = Recording()
    with pytest.raises(SystemExit), comm:
        sys.exit(code)
    assert comm.aborted is None


def test_a_communicator_for_another_device_is_refused():
    class GPURanks(Recording):
        device = "gpu"

    net = Net('''layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
                 layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
                         inner_product_param { num_output: 2 } }''')
    with pytest.raises(SolverError, match="params are on the cpu.*arrays on the gpu"):
        Solver(net, comm=GPURanks(), base_lr=0.1)


def test_unknown_device_is_an_error():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        init("tpu")
