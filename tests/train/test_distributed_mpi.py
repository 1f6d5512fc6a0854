"""Data-parallel training under ``mpiexec -n 2``: equal to iter_size 2, resumable, fails fast.

The tests launch this same file as the MPI program (``mpiexec -n 2 python
THIS_FILE ...``, see :func:`worker`), and compare what the ranks wrote with a
single process computed here. They are skipped only where mpi4py or mpiexec is
missing; CI installs both (the ``mpi`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

import unroll
from tests.hang import limit
from unroll.engine.backend import GPU_AVAILABLE, to_numpy
from unroll.train import distributed
from unroll.train.bucketed_model import BucketedModel
from unroll.train.bucketing import time_major
from unroll.train.solver import Solver
from unroll.train.solver_callbacks import AllReduce

ROOT = Path(__file__).resolve().parents[2]  # on the ranks' PYTHONPATH: this checkout's unroll

N = 3  # sequences per batch
SOLVER = dict(type="Adam", base_lr=0.05, momentum=0.9, momentum2=0.999, weight_decay=1e-3,
              clip_gradients=1.0)


def lstm_net(T: int):
    """An LSTM over (T, N, 3) inputs, a linear read-out of every step, a Euclidean loss."""
    net = unroll.expand("lstm", steps=T, batch=N, input_dim=3, hidden=4)
    text_format.Merge(f"""
      layer {{ name: "target" type: "Input" top: "y" input_param {{ shape {{ dim: {T} dim: {N}
               dim: 2 }} }} }}
      layer {{ name: "out" type: "InnerProduct" bottom: "h" top: "p" param {{ name: "W_out" }}
               param {{ name: "b_out" }} inner_product_param {{ num_output: 2 axis: 2
               weight_filler {{ type: "gaussian" std: 0.3 }} }} }}
      layer {{ name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }}""", net)
    return net


def tagger_net(T: int):
    """The tagger template, small and without dropout (masks would differ between ranks)."""
    return unroll.expand("tagger", steps=T, batch=N, vocab=20, tags=5, embed=6, hidden=5,
                         layers=1, cell="lstm", dropout=0.0, features={}, chars={},
                         ignore_label=-1)


def lstm_batch(k: int) -> dict:
    rng = np.random.default_rng(100 + k)
    T = 2 + k % 4  # ranks draw different T in one step
    cont = np.ones((T, N))
    cont[0] = 0
    return {"x": rng.normal(size=(T, N, 3)), "cont": cont, "y": rng.normal(size=(T, N, 2))}


def tagger_batch(k: int) -> dict:
    rng = np.random.default_rng(200 + k)
    T = 2 + k % 4
    lengths = rng.integers(1, T + 1, size=N)
    lengths[0] = T
    words, cont = time_major([rng.integers(1, 20, n) for n in lengths], T)
    labels, _ = time_major([rng.integers(0, 5, n) for n in lengths], T, -1)
    return {"words": words, "cont": cont, "labels": labels}


MODELS = {"lstm": (lstm_net, lstm_batch, None), "tagger": (tagger_net, tagger_batch, "words")}


def model(kind: str, device: str = "cpu") -> BucketedModel:
    make, _, steps_from = MODELS[kind]
    return BucketedModel(make, dtype="float64", seed=7, steps_from=steps_from, device=device)


# -- the MPI program ---------------------------------------------------------------------


def worker(argv) -> None:
    """One rank: train ``--steps`` on batch ``step * size + rank``; see the tests for the rest."""
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=list(MODELS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--snapshot", type=int, default=0)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--failure", choices=["raise", "exit", "kill"])
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    args = parser.parse_args(argv)
    comm = distributed.init(args.device)
    kind = args.kind
    net = model(kind, args.device)
    solver = Solver(net, comm=comm, snapshot=args.snapshot, snapshot_prefix=str(args.out / "s"),
                    **SOLVER)
    # the ranks' gradients meet in the solver's all-reduce callback, the first it runs
    assert isinstance(solver.callbacks[0], AllReduce) and solver.callbacks[0].comm is comm
    if args.resume:
        solver.restore(args.resume)
    batch = MODELS[kind][1]

    def train():
        while solver.iter < args.steps:
            if args.failure and comm.rank == 1 and solver.iter == 1:
                fail(args.failure)
            solver.step(1, feed=lambda _: batch(solver.iter * comm.size + comm.rank))
            values = comm.mpi.allgather(to_numpy(net.store.data))
            if any(not np.array_equal(values[0], v) for v in values):
                raise RuntimeError(f"ranks hold different params after iteration {solver.iter}")

    if args.failure == "raise":
        train()  # uncaught: init()'s sys.excepthook must end every rank
    else:
        with comm:  # a SystemExit inside must end every rank too
            train()
    if comm.rank == 0:
        np.save(args.out / "params.npy", to_numpy(net.store.data))


def fail(how: str) -> None:
    if how == "raise":
        raise RuntimeError("deliberate failure")
    if how == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


# -- the tests -----------------------------------------------------------------------------


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"  # where the mpich wheel puts it
    return str(beside) if beside.is_file() else shutil.which("mpiexec")


def _mpi4py_missing() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return True
    return False


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    _mpiexec() is None or _mpi4py_missing(),
    reason="needs mpi4py and mpiexec: pip install -e '.[mpi]'",
)]


def launch(*args) -> subprocess.CompletedProcess:
    """Run this file's :func:`worker` under ``mpiexec -n 2``."""
    return mpiexec(__file__, *args)


def mpiexec(*argv, ranks: int = 2,
            timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run ``python *argv`` under ``mpiexec -n ranks``; a hang fails the test instead of CI."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    command = [_mpiexec(), "-n", str(ranks), sys.executable, *map(str, argv)]
    timeout = limit(300) if timeout is None else timeout
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"mpiexec -n {ranks} {' '.join(map(str, argv))} hung for {timeout:.0f} s")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def single_process(kind: str, steps: int, iter_size: int) -> np.ndarray:
    net = model(kind)
    Solver(net, iter_size=iter_size, **SOLVER).step(steps, feed=MODELS[kind][1])
    if steps == 0:  # given steps_from, no net is built before a batch asks for one
        net.forward(**MODELS[kind][1](0))
        net.store.pack()
    return net.store.data


@pytest.mark.parametrize("kind", list(MODELS))
def test_two_ranks_equal_one_process_with_iter_size_two(kind, tmp_path):
    run = launch(kind, tmp_path, "--steps", 4)
    assert run.returncode == 0, run.stderr
    ranks = np.load(tmp_path / "params.npy")
    alone = single_process(kind, 4, iter_size=2)
    assert np.abs(alone - single_process(kind, 0, iter_size=1)).max() > 1e-3, "params must move"
    np.testing.assert_array_equal(ranks, alone)  # exactly: docs/design.md, 7. Scale-out


def _gpus() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE or _gpus() < 2, reason="NCCL needs two GPUs, one per rank")
def test_two_gpu_ranks_over_nccl_equal_one_process_with_iter_size_two(tmp_path):
    run = launch("lstm", tmp_path, "--steps", 4, "--device", "gpu")
    assert run.returncode == 0, run.stderr
    np.testing.assert_allclose(np.load(tmp_path / "params.npy"),
                               single_process("lstm", 4, iter_size=2), rtol=0, atol=1e-6)


def test_snapshot_and_resume_under_two_ranks_continue_exactly(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    run = launch("lstm", first, "--steps", 4, "--snapshot", 2)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in first.iterdir()) == [
        "params.npy", "s_iter_2.caffemodel", "s_iter_2.solverstate", "s_iter_4.caffemodel",
        "s_iter_4.solverstate",
    ]
    run = launch("lstm", second, "--steps", 4, "--resume", first / "s_iter_2.solverstate")
    assert run.returncode == 0, run.stderr
    np.testing.assert_array_equal(np.load(second / "params.npy"), np.load(first / "params.npy"))


@pytest.mark.parametrize("failure", ["raise", "exit", "kill"])
def test_a_failing_rank_ends_the_whole_job(failure, tmp_path):
    run = launch("lstm", tmp_path, "--steps", 1000, "--failure", failure)
    assert run.returncode != 0
    if failure != "kill":  # a killed rank cannot speak; mpiexec reports it
        assert "rank 1 of 2 failed" in run.stderr, run.stderr
    assert not (tmp_path / "params.npy").exists()


def test_the_tagger_trains_data_parallel_and_resumes(tmp_path):
    from examples.pos_tagging.packing import training_sampler
    from examples.pos_tagging.train import DEV_FILE, TRAIN_FILE
    from unroll.tools.conllu import write_conllu

    tag_of = {"the": "DET", "a": "DET", "cat": "NOUN", "dog": "NOUN", "mat": "NOUN",
              "sat": "VERB", "ran": "VERB", "on": "ADP", ".": "PUNCT"}
    rng = np.random.default_rng(0)
    train_sentences, dev_sentences = (
        [list(rng.choice(list(tag_of), size=rng.integers(2, 9))) for _ in range(count)]
        for count in (48, 12)
    )
    for name, sentences in ((TRAIN_FILE, train_sentences), (DEV_FILE, dev_sentences)):
        write_conllu(sentences, [[tag_of[w] for w in s] for s in sentences], tmp_path / name)
    steps = len(training_sampler([len(s) for s in train_sentences], batch=4, size=2))
    model_dir = tmp_path / "model"
    train = ["-m", "examples.pos_tagging", "train", "--data", tmp_path, "--model-dir", model_dir,
             "--batch-size", 4, "--embed", 8, "--hidden", 8, "--layers", 1, "--char-hidden", 0,
             "--quiet"]
    run = mpiexec(*train, "--epochs", 2)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("epoch 1:") == 1 and run.stdout.count("done:") == 1, run.stdout
    log = json.loads((model_dir / "log.json").read_text())
    assert [e["epoch"] for e in log] == [1, 2]
    assert log[-1]["iter"] == 2 * steps  # each rank takes half of each epoch's batches
    run = mpiexec(*train, "--epochs", 3, "--resume")
    assert run.returncode == 0, run.stderr
    log = json.loads((model_dir / "log.json").read_text())
    assert [e["epoch"] for e in log] == [1, 2, 3] and log[-1]["iter"] == 3 * steps
    assert (model_dir / "best.caffemodel").is_file()


if __name__ == "__main__":
    worker(sys.argv[1:])
