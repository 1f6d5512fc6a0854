"""Microseconds per recurrent-unit call: the fused kernels against the ``xp`` reference.

Times one LSTMUnit and one GRUUnit layer, forward and backward separately, on
(1, N, H) blobs as an unrolled step feeds them (N=32; H=128 and 512 by
default), for both engines. Compilation (numba's first call) happens before
the clock starts. Prints medians over several rounds. A benchmark, not a
test: run it on an idle machine, with nothing else on the cores.

    python -m bench.bench_units                      (from the repository root)
    python -m bench.bench_units --hidden 128 --dtype float64
    python -m bench.bench_units --split --threads 1 2

``--split`` asks whether the unit's rows split over two cores can pay: a step's
recurrent GEMM (N x H by H x 4H) and then the LSTMUnit forward on its output, the
unit whole, its rows halved with the second half on a Python thread woken by an
Event, or over numba's ``prange`` (the threading layer numba picks, or
``NUMBA_THREADING_LAYER``), each at every BLAS thread count: µs a step, the least
of the rounds taken in turns, by wall and by process CPU time (a thread that
spins, OpenBLAS's worker or numba's, shows as CPU time above the wall time). It
first prints how long OpenBLAS's workers spin after a GEMM: the process's CPU time
while its one Python thread sleeps (``OPENBLAS_THREAD_TIMEOUT``, read when NumPy
loads OpenBLAS, bounds it: 2^n cycles, n from 4 to 30, 28 by default). With the
``mkl`` wheel here (or ``--mkl PATH``, its libmkl_rt), in float32, two more variants take the GEMM
from MKL on its GNU threading layer: MKL's workers are then libgomp's, the pool numba's
omp layer runs ``prange`` on, so the product and the split unit share one pool instead
of two spinning for the cores.

The GEMM is the product as InnerProduct computes a timestep's few rows (W h^T, copied
back).

Measured idle, 2026-12-03 (2-core AMD Zen 4, AVX-512, N=32, two BLAS threads,
``OPENBLAS_THREAD_TIMEOUT=20`` in the environment, the value ``import unroll``
sets, since this bench loads NumPy first; MKL 2026.2; µs a step by wall
time at H = 128 / 256 / 512): the whole unit 64 / 201 / 571; half on a thread 106 / 234
/ 649; over prange (omp) 949 / 1,266 / 2,190; MKL's GEMM and the whole unit 80 / 245 /
696; MKL's GEMM and prange on the one pool 70 / 240 / 653. Under
``NUMBA_THREADING_LAYER=workqueue``: whole 67 / 185 / 559, half on a thread 123 / 237 /
606, prange 174 / 282 / 639. One pool takes the collapse away, but MKL's product of 32
rows at two threads is slower than OpenBLAS's; no split beat the whole unit.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import numpy as np

from bench.bench_gemm import NO_TRANS, ROW_MAJOR, TRANS, load_mkl, mkl_path
from bench.timing import least_us_per_call, median_seconds
from unroll.core.proto import LayerParameter, parse_text
from unroll.engine.blob import Blob
from unroll.engine.kernels import ENGINE_VARIABLE
from unroll.engine.layer import layer_class

UNITS = {"LSTMUnit": (4, 1, 2), "GRUUnit": (3, 2, 1)}  # gates, projections, tops


def build(unit: str, N: int, H: int, dtype, engine: str):
    """A set-up layer, its bottoms (random values) and tops with random diffs."""
    gates, n_projections, n_tops = UNITS[unit]
    os.environ[ENGINE_VARIABLE] = engine
    param = parse_text(f'name: "{unit}" type: "{unit}"', LayerParameter())
    layer = layer_class(param)(param, dtype=dtype)
    rng = np.random.default_rng(0)
    shapes = [(1, N, H)] + [(1, N, gates * H)] * n_projections + [(1, N)]
    bottoms = [Blob(s, np, dtype, f"b{i}") for i, s in enumerate(shapes)]
    for b in bottoms[:-1]:
        b.data[...] = rng.uniform(-2, 2, b.shape)
    bottoms[-1].data[...] = 1.0
    tops = [Blob((), np, dtype, f"t{i}") for i in range(n_tops)]
    layer.set_up(bottoms, tops)
    for t in tops:
        t.diff[...] = rng.uniform(-1, 1, t.shape)
    return layer, bottoms, tops


class HalfOnAThread:
    """Runs ``second()`` on a waiting Python thread while the caller runs ``first()``."""

    def __init__(self):
        self.go, self.done, self.job = threading.Event(), threading.Event(), None
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            self.go.wait()
            self.go.clear()
            self.job()
            self.done.set()

    def __call__(self, first, second):
        self.job = second
        self.done.clear()
        self.go.set()
        first()
        self.done.wait()


def prange_forward():
    """lstm_unit_forward on the two halves of the rows over numba's threads (compiled on
    first use): the thread variant's split, each half on a thread of numba's layer."""
    from numba import njit, prange

    from unroll.engine.kernels.cpu import lstm_unit_forward

    @njit(parallel=True, nogil=True)
    def forward(c_prev, x, cont, c, h):
        rows, H = cont.size, c.shape[-1]
        c_prev, c, h = c_prev.reshape((rows, H)), c.reshape((rows, H)), h.reshape((rows, H))
        x, cont = x.reshape((rows, 4 * H)), cont.reshape(rows)
        for k in prange(2):
            a, b = k * (rows // 2), rows if k else rows // 2
            lstm_unit_forward(c_prev[a:b], x[a:b], cont[a:b], c[a:b], h[a:b])

    return forward


def mkl_gemm(path: Path):
    """``gemm(h, W, out)``: out = h W^T (float32) by MKL's cblas_sgemm, on MKL's GNU
    threading layer (libgomp's workers); ``gemm.threads(n)`` sets MKL's thread count."""
    os.environ.setdefault("MKL_THREADING_LAYER", "GNU")  # read when libmkl_rt loads
    mkl = load_mkl(path)

    def gemm(h, W, out):
        (rows, K), n = h.shape, W.shape[0]
        mkl.cblas_sgemm(ROW_MAJOR, NO_TRANS, TRANS, rows, n, K, 1.0, h.ctypes.data, K,
                        W.ctypes.data, K, 0.0, out.ctypes.data, n)

    gemm.threads = mkl.MKL_Set_Num_Threads_Local
    return gemm


def split_steps(N: int, H: int, dtype, mkl=None) -> dict:
    """{variant: a step}: the recurrent GEMM, then the unit whole, split or not at all;
    with ``mkl`` (:func:`mkl_gemm`), the GEMM by MKL too."""
    import numba

    from unroll.engine.kernels import cpu

    rng = np.random.default_rng(0)
    h = rng.uniform(-1, 1, (N, H)).astype(dtype)
    W = rng.uniform(-0.1, 0.1, (4 * H, H)).astype(dtype)
    x = np.empty((1, N, 4 * H), dtype)
    c_prev = rng.uniform(-1, 1, (1, N, H)).astype(dtype)
    cont, c, c_h = np.ones((1, N), dtype), np.empty_like(c_prev), np.empty_like(c_prev)
    halves = [tuple(a[:, rows] for a in (c_prev, x, cont, c, c_h))
              for rows in (slice(None, N // 2), slice(N // 2, None))]
    on_thread, forward = HalfOnAThread(), prange_forward()
    unit = cpu.lstm_unit_forward

    scratch = np.empty((4 * H, N), dtype)

    def gemm():  # as InnerProduct computes a few rows: W h^T, copied back
        np.matmul(W, h.T, out=scratch)
        np.copyto(x[0], scratch.T)

    def whole():
        gemm()
        unit(c_prev, x, cont, c, c_h)

    def threaded():
        gemm()
        on_thread(lambda: unit(*halves[0]), lambda: unit(*halves[1]))

    def over_prange():
        gemm()
        forward(c_prev, x, cont, c, c_h)

    whole()
    expected = c.copy(), c_h.copy()
    for variant in (threaded, over_prange):
        c[...], c_h[...] = 0, 0
        variant()
        if not (np.array_equal(c, expected[0]) and np.array_equal(c_h, expected[1])):
            raise SystemExit(f"{variant.__name__}: results differ from the whole unit's")
    layer = numba.threading_layer()
    steps = {"GEMM alone": gemm, "GEMM + unit": whole, "+ unit, half on a thread": threaded,
             f"+ unit over prange ({layer})": over_prange}
    if mkl is not None:
        def mkl_whole():
            mkl(h, W, x[0])
            unit(c_prev, x, cont, c, c_h)

        def mkl_prange():
            mkl(h, W, x[0])
            forward(c_prev, x, cont, c, c_h)

        steps |= {"MKL GEMM + unit": mkl_whole, f"MKL GEMM + unit over prange ({layer})":
                  mkl_prange}
    return steps


def spin_after_gemm(H: int, dtype, asleep: float = 0.2) -> float:
    """CPU ms the process spends while its caller sleeps ``asleep`` s after one GEMM."""
    x, W = np.ones((32, H), dtype), np.ones((4 * H, H), dtype)
    for _ in range(20):
        x @ W.T
    cpu = time.process_time()
    time.sleep(asleep)
    return (time.process_time() - cpu) * 1e3


def split(args, dtype) -> None:
    from unroll.engine.threads import run_threads

    # MKL's variants multiply in float32 (cblas_sgemm), the bench's default dtype
    mkl = mkl_gemm(args.mkl) if args.mkl and dtype == np.float32 else None

    for count in args.threads:
        with run_threads(count):
            spun = spin_after_gemm(max(args.hidden), dtype)
        print(f"BLAS threads {count}: {spun:.1f} ms of CPU while the caller slept 200 ms "
              f"after a GEMM")
    print(f"the recurrent GEMM then LSTMUnit forward, N={args.batch}, {args.dtype}: µs a "
          f"step, wall | CPU, least of {args.rounds} rounds of {args.calls} calls in turns")
    for H in args.hidden:
        steps = split_steps(args.batch, H, dtype, mkl)
        for count in args.threads:
            if mkl is not None:
                mkl.threads(count)
            with run_threads(count):
                wall = least_us_per_call(steps, time.perf_counter, args.calls, args.rounds)
                cpu = least_us_per_call(steps, time.process_time, args.calls, args.rounds)
            for name in steps:
                print(f"  H={H:4d} BLAS threads {count}  {name:32s} {wall[name]:8.1f} |"
                      f"{cpu[name]:8.1f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="N (default 32)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512], help="H values")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--split", action="store_true",
                        help="only the unit after a GEMM, whole and split over two cores")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="BLAS thread counts for --split (default 1 2)")
    parser.add_argument("--mkl", type=Path, default=mkl_path(),
                        help="libmkl_rt for --split's MKL variants (default: the mkl wheel's, "
                             "if installed)")
    args = parser.parse_args(argv)
    dtype = np.dtype(args.dtype)
    if args.split:
        split(args, dtype)
        return
    propagate = {"LSTMUnit": [True, True, False], "GRUUnit": [True, True, True, False]}
    print(f"unit      H  engine     forward us  backward us  total us   ({args.dtype}, "
          f"N={args.batch}, median of {args.rounds} x {args.calls} calls)")
    for unit in UNITS:
        for H in args.hidden:
            totals = {}
            for engine in ("reference", "fused"):
                layer, bottoms, tops = build(unit, args.batch, H, dtype, engine)

                def forward(layer=layer, bottoms=bottoms, tops=tops):
                    layer.forward(bottoms, tops)

                def backward(layer=layer, bottoms=bottoms, tops=tops, unit=unit):
                    layer.backward(tops, propagate[unit], bottoms)

                # the warm-up compiles (or loads) the kernels
                f = median_seconds(forward, args.calls, args.rounds) * 1e6
                b = median_seconds(backward, args.calls, args.rounds) * 1e6
                totals[engine] = f + b
                print(f"{unit:8s} {H:4d}  {engine:9s} {f:11.1f} {b:12.1f} {f + b:9.1f}")
            speedup = totals["reference"] / totals["fused"]
            print(f"{unit:8s} {H:4d}  reference / fused: {speedup:.2f}x")


if __name__ == "__main__":
    main()
