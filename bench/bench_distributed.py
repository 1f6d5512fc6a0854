"""Data-parallel throughput: 2 ranks x 1 BLAS thread against 1 rank x 2 BLAS threads.

Trains the default tagger (the README's ``train`` model) on the same UD EWT
batches twice: once in one process with 2 BLAS threads, once under
``mpiexec -n 2`` with 1 thread per rank, where each rank takes every second
batch and the gradients are summed in one all-reduce per step. Prints real
tokens/s (padding excluded), seconds per step, the all-reduce volume per step
and the time of one all-reduce, the figures a scaling estimate needs. The nets
of every bucket are built before timing. A benchmark, not a test: run it on
an idle machine.

    python -m bench.bench_distributed --batches 120      (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ud_english_ewt"
ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    """One rank: train ``args.batches`` batches split over the ranks; rank 0 prints JSON."""
    import numpy as np

    from bench.bench_tagger import load
    from examples.pos_tagging.tagger import Tagger, TaggerConfig
    from unroll.train import distributed
    from unroll.train.bucketing import BucketSampler
    from unroll.train.solver import Solver

    comm = distributed.init()
    sents, featurizer, gold = load(args.data)
    tagger = Tagger(featurizer, TaggerConfig(batch=args.batch_size), seed=args.seed)
    lengths = [len(f) for f, _ in sents]
    sampler = BucketSampler(lengths, batch_size=args.batch_size, seed=args.seed,
                            rank=comm.rank, size=comm.size)
    mine = sampler.epoch_batches(0)[: args.batches // comm.size]
    encoded = tagger.encode([sents[i][0] for b in mine for i in b])
    feeds, k = [], 0
    for b in mine:
        feeds.append(tagger.inputs(encoded[k : k + len(b)], sampler.bucket_length(b),
                                   [gold[i] for i in b], train=True))
        k += len(b)
    model = tagger.train_model
    for b in mine:  # every bucket's net before timing
        model.net(sampler.bucket_length(b))
    solver = Solver(model, type="Adam", base_lr=2e-3, momentum=0.9, momentum2=0.999,
                    clip_gradients=5.0, comm=comm)
    solver.step(1, feed=lambda _: feeds[0])  # first touch of every buffer
    comm.barrier()
    start = time.perf_counter()
    for inputs in feeds[1:]:
        solver.step(1, feed=lambda _, inputs=inputs: inputs)
    comm.barrier()
    seconds = time.perf_counter() - start
    tokens = comm.sum(sum(lengths[i] for b in mine[1:] for i in b))
    diff = model.store.diff
    reduce_seconds = []
    for _ in range(args.reduces):
        comm.barrier()
        t0 = time.perf_counter()
        comm.allreduce_sum(diff)
        reduce_seconds.append(time.perf_counter() - t0)
    if comm.rank == 0:
        print(json.dumps({
            "ranks": comm.size, "tokens_per_s": tokens / seconds,
            "seconds_per_step": seconds / (len(mine) - 1),
            "params": int(diff.size), "bytes_per_step": int(diff.nbytes),
            "allreduce_s": float(np.median(reduce_seconds)) if comm.size > 1 else 0.0,
        }))


def launch(ranks: int, threads: int, args) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    # UNROLL_NUM_THREADS: each net run sets the BLAS pool to the engine's count, which
    # would otherwise be the free cores, not ``threads``
    env.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), UNROLL_NUM_THREADS=str(threads),
               PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "bench.bench_distributed", "--worker",
               "--data", str(args.data), "--batches", str(args.batches),
               "--batch-size", str(args.batch_size), "--reduces", str(args.reduces)]
    if ranks > 1:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        mpiexec = str(mpiexec) if mpiexec.is_file() else shutil.which("mpiexec")
        if mpiexec is None:
            sys.exit("bench_distributed: mpiexec not found; pip install -e '.[mpi]'")
        command = [mpiexec, "-n", str(ranks), *command]
    out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_distributed: {' '.join(command)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--batches", type=int, default=120, help="batches timed in all")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--reduces", type=int, default=20, help="all-reduces timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if not (args.data / "en_ewt-ud-train.conllu").is_file():
        sys.exit(f"bench_distributed: no en_ewt-ud-train.conllu in {args.data}; pass --data")
    alone, pair = launch(1, 2, args), launch(2, 1, args)
    print(f"{'run':26} {'tokens/s':>9} {'s/step':>8}")
    for name, r in (("1 rank x 2 BLAS threads", alone), ("2 ranks x 1 BLAS thread", pair)):
        print(f"{name:26} {r['tokens_per_s']:9.0f} {r['seconds_per_step']:8.3f}")
    print(f"2 ranks / 1 rank tokens/s: {pair['tokens_per_s'] / alone['tokens_per_s']:.2f}")
    mb = pair["bytes_per_step"] / 1e6
    print(f"all-reduce per step: {pair['params']:,} params, {mb:.1f} MB; one all-reduce "
          f"{1e3 * pair['allreduce_s']:.2f} ms (median of {args.reduces}), "
          f"{mb / 1e3 / max(pair['allreduce_s'], 1e-9):.2f} GB/s")


if __name__ == "__main__":
    main()
