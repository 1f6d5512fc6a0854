"""The LSTM step's GEMMs, bare: NumPy's OpenBLAS against MKL's sgemm, MKL's packed sgemm
and torch's product.

Each product of one training step of ``unroll.expand("lstm")`` at N=32 rows, D=100 inputs,
H hidden, float32, as the engine computes it today (``InnerProductLayer``: y = x W^T through
W x^T for a few rows; the weight gradient over the T*N rows of every step at once, added
into the diff):

    x@W^T    the input projection, (C*N, D) by the input weights W (4H, D), once a chunk
             of C = min(T, 32) steps (expand's chunk)
    h@U^T    (N, H) by the recurrent weights U (4H, H), once a step
    g@U      the recurrent bottom diff, (N, 4H) by U, once a step
    g@W      the input bottom diff, (C*N, 4H) by W, once a chunk
    gU+=g'h  U's gradient over T*N rows: (4H, T*N) by (T*N, H), once a run
    gW+=g'x  W's gradient over T*N rows: (4H, T*N) by (T*N, D), once a run

against MKL's ``cblas_sgemm`` (with beta=1 where the diff is added) and, for the four
products by a weight, ``cblas_sgemm_compute`` on the weight packed once
(``cblas_sgemm_pack``; its cost is printed apart, as it is paid once per weight update,
not once per step). MKL is loaded with ctypes from the ``mkl`` wheel
(``pip install mkl``: libmkl_rt beside this interpreter's lib/).

Each side runs in a process of its own (MKL's OpenMP workers spin after a call and would
slow an OpenBLAS timed beside them; MKL fixes its threading layer and reproducibility
mode when it loads and at its first call), at one and two threads (threadpoolctl's
OpenBLAS limit; MKL's ``mkl_set_num_threads_local``), the sides in turns, ``--turns``
times. At one thread an MKL side loads MKL's SEQUENTIAL threading layer (no OpenMP pool
at all, as a single-threaded caller gets it); at two, ``--layer`` (GNU: libgomp, the
default; INTEL: libiomp5). Within a turn a product's time is the least µs per call of its
rounds (the round the machine slowed least), and the median over the turns is printed,
with each time's median ratio to NumPy's time of the same turn, so a machine whose speed
drifts slows each alike. ``--clock cpu`` times by the process's CPU time, which other
processes' time slices do not inflate (steady at one thread; at two it counts a pool's
spinning). The NumPy column is the product as the engine computes it (a few rows by a
transposed weight as W x^T, ``InnerProductLayer``'s FEW_ROWS); "numpy plain" is such a
product as written, x W^T. Each product's result is checked bit for bit between one and
two threads, and MKL's sgemm over two column blocks of the result (one call a block, as
two Python threads would share a product) against one call. The side ``at-once`` times
the run's two weight gradients (gU, gW) at two threads, one after the other on a pool
of two, and at once on two Python threads with one BLAS thread each.

The MKL sides are MKL's conditional numerical reproducibility modes (``mkl_cbwr_set``):
``off`` (MKL picks its code path), ``strict`` (MKL_CBWR_AUTO | MKL_CBWR_STRICT: the same
bits at any thread count) and ``compatible`` (MKL_CBWR_COMPATIBLE | MKL_CBWR_STRICT, the
SSE2 path). The instruction-set branches (MKL_CBWR_AVX2, MKL_CBWR_AVX512) are refused on
AMD CPUs. A benchmark, not a test.

    python -m bench.bench_gemm                                 (from the repository root)
    python -m bench.bench_gemm --hidden 512 --steps 100 --sides numpy off --turns 9
    python -m bench.bench_gemm --clock cpu
    python -m bench.bench_gemm --sides numpy torch --torch-python VENV/bin/python --clock cpu

Unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for this command where they are set: they
slow a current NumPy's OpenBLAS.

Measured on a 2-core AMD Zen 4 (AVX-512) shared with other work (load 8), MKL 2026.2
(SEQUENTIAL layer at one thread) against NumPy 2.4's OpenBLAS 0.3.31 (SkylakeX kernels),
``--clock cpu --steps 100 --sides numpy off strict``, 3 turns of 3 rounds, two runs. At one
thread MKL's sgemm of a few rows by a transposed weight beats OpenBLAS's product as
written by far (h@U^T at H=512: 882-911 against 1176-1251 µs, the 0.7x a bare comparison
finds), but the engine does not compute it as written: through W x^T OpenBLAS takes
835-873 µs, and MKL's sgemm 1.02-1.06x that (0.90-0.93x at H=128, 54 against 58-60 µs).
The input projection x@W^T took 0.97-1.01x OpenBLAS's time (the "off" side of one run
1.37x at H=512), the bottom diffs g@U and g@W and the weight gradients 1.02-1.31x,
packed or not; MKL_CBWR_AUTO | MKL_CBWR_STRICT changed no figure beyond the noise.
Every product gave the same bits at one thread (SEQUENTIAL) and two (GNU), in every mode,
and over two column blocks as in one call. So the engine keeps NumPy's GEMMs: against the
products the engine runs, MKL does not pay at one thread.
The side ``torch`` runs each product with ``torch.mm`` (``addmm_`` where the diff is added)
on the same arrays, under ``--torch-python``, with ``torch.set_num_threads``: torch's CPU
wheel calls its own MKL's SGEMM there (``MKL_VERBOSE=1`` shows it; 2024.0 in torch 2.13),
not oneDNN. Its nn.LSTM does not go through ``torch.mm`` at all but through oneDNN's
fused RNN primitive (``python -m bench.profile_lstm --torch-python ...``). The column
``relaid`` is a step's product by a row-major copy of the weight stored the other way
round (x W^T by W^T where the engine runs W x^T; g U as (U^T g^T)^T by U^T), as a copy
made once per weight update would hold it; it gives the same bits as the engine's product
(OpenBLAS accumulates each output in the same order either way).

Measured on the same machine, busy (load 2-8), ``--clock cpu --sides numpy torch``, 3 turns
of 3 rounds, one thread, two runs (and MKL 2024.0's wheel as the ``off`` side, one run).
torch.mm takes 0.73-0.87x NumPy's time on the step's forward product h@U^T at every size
(MKL 2024.0's sgemm 0.78-0.82x; 2026.2's 1.02-1.06x, above), 0.90-0.96x on g@U at H=512
but 0.96-1.06x at H=128, and 0.88-1.34x on the products over all steps (the weight
gradient gU at T=100 H=512 1.11-1.29x). So torch's lead over the engine's GEMMs at one
thread is in oneDNN's RNN primitive and, for its products, in one MKL build's kernels for
32-row products, not in a layout NumPy could take: "relaid" pays 0.80-0.84x on h@U^T at
H=128 (about 12 µs a step, 1% of the step) and 0.91-1.04x on g@U at H=512 (at most 80 µs
a step, 2%, less a copy of U per run), and takes 0.99-1.22x elsewhere. MKL 2024.0's
sgemm gives other bits than OpenBLAS on most of these products (h@U^T at H=512 and every
backward one), so an MKL product would change the engine's results. The engine keeps its
products.
The column ``onednn`` (the torch side) is the product by oneDNN's packed weight, torch's
``to_mkldnn`` Linear, as an engine holding NumPy arrays would have to run it: the weight
reordered once, the rows converted to oneDNN's layout and the result back on every call.
Idle, 2026-12-03, same machine, three turns, T=25: 1.98x / 2.23x NumPy's time on h@U^T at
H=128 (one / two threads), 1.11x / 1.28x at H=512; on g@U 2.49x / 2.30x and 1.07x / 1.06x;
the same bits at both thread counts. So oneDNN's packed products do not pay either.
Two-thread times on that machine measured its load (a pool of two waiting on a
descheduled partner: 0.08-13x between runs), not the libraries: they are for an idle
machine to tell.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.timing import least_us_per_call

ROW_MAJOR, NO_TRANS, TRANS, PACKED = 101, 111, 112, 151
B_MATRIX = 162
CBWR_STRICT = 0x10000
#: the MKL sides: MKL's conditional numerical reproducibility mode of each (mkl_cbwr_set).
#: The instruction-set branches (MKL_CBWR_AVX2, ...) are refused on AMD CPUs; AUTO with
#: STRICT (the same result at any thread count) and COMPATIBLE (SSE2) are accepted
CBWR = {"off": 0, "strict": 2 | CBWR_STRICT, "compatible": 3 | CBWR_STRICT}
CBWR_ERRORS = {-1: "invalid settings", -2: "invalid input", -3: "branch not supported on this CPU",
               -4: "unknown branch", -8: "mode already fixed by an earlier MKL call"}
#: the multiply-adds of one timed round of a product (a product at least once)
WORK = 1e8


#: the columns of the table of each side that is not an MKL side (which has sgemm, packed)
IMPLS = {"numpy": ("plain", "relaid"), "torch": ("torch", "onednn")}

#: the steps of one input projection (``unroll.expand``'s default chunk)
CHUNK = 32


def mkl_path() -> Path | None:
    """libmkl_rt of the ``mkl`` wheel, beside this interpreter's lib/, if installed."""
    for name in ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"):
        path = Path(sys.prefix) / "lib" / name
        if path.exists():
            return path
    return None


def load_mkl(path: Path | None = None) -> ctypes.CDLL:
    """MKL's runtime library (``path``, default :func:`mkl_path`), with the signatures of
    the calls timed here."""
    mkl = ctypes.CDLL(str(path or mkl_path()))
    f32p, i = ctypes.c_void_p, ctypes.c_int
    mkl.cblas_sgemm.argtypes = [i, i, i, i, i, i, ctypes.c_float, f32p, i, f32p, i,
                                ctypes.c_float, f32p, i]
    mkl.cblas_sgemm.restype = None
    mkl.cblas_sgemm_pack_get_size.argtypes = [i, i, i, i]
    mkl.cblas_sgemm_pack_get_size.restype = ctypes.c_size_t
    mkl.cblas_sgemm_pack.argtypes = [i, i, i, i, i, i, ctypes.c_float, f32p, i, f32p]
    mkl.cblas_sgemm_pack.restype = None
    mkl.cblas_sgemm_compute.argtypes = [i, i, i, i, i, i, f32p, i, f32p, i, ctypes.c_float,
                                        f32p, i]
    mkl.cblas_sgemm_compute.restype = None
    mkl.MKL_Set_Num_Threads_Local.argtypes = [i]
    mkl.MKL_Set_Num_Threads_Local.restype = i
    mkl.MKL_CBWR_Set.argtypes = [i]
    mkl.MKL_CBWR_Set.restype = i
    mkl.MKL_CBWR_Get_Auto_Branch.restype = i
    mkl.MKL_Get_Version_String.argtypes = [ctypes.c_char_p, i]
    mkl.MKL_Get_Version_String.restype = None
    return mkl


def operand(a: np.ndarray) -> tuple[int, int, int]:
    """(transposition, address, leading dimension) of a row-major array or a transposed one."""
    if a.flags.c_contiguous:
        return NO_TRANS, a.ctypes.data, a.shape[1]
    assert a.T.flags.c_contiguous, "operands are row-major arrays or their transposes"
    return TRANS, a.ctypes.data, a.shape[0]


class Product:
    """C (M, N) = A (M, K) B (K, N), A and B row-major arrays or their transposes; ``add``:
    C += instead of C =. Gives the NumPy, MKL and packed-MKL calls over fixed arrays."""

    def __init__(self, name, mkl, a, b, add, few_rows):
        self.name, self.mkl, self.a, self.b = name, mkl, a, b
        self.add, self.few_rows = add, few_rows
        self.M, self.K = a.shape
        self.N = b.shape[1]
        self.c = np.zeros((self.M, self.N), np.float32)
        self.cT = np.zeros((self.N, self.M), np.float32)
        self.packed = None
        self.tensors = None
        self.dnnl = None
        self.other = None  # the weight stored the other way round (relaid)

    def numpy(self):
        if self.add:
            self.c += self.a @ self.b
        elif self.few_rows:  # InnerProductLayer's W x^T for a few rows
            np.matmul(self.b.T, self.a.T, out=self.cT)
            np.copyto(self.c, self.cT.T)
        else:
            np.matmul(self.a, self.b, out=self.c)

    def plain(self):
        """A product of a few rows as it is written, x W^T, not through W x^T."""
        np.matmul(self.a, self.b, out=self.c)

    def relaid(self):
        """A product of a few rows by the weight stored the other way round, as a copy
        made once per weight update would hold it: x W^T by a row-major W^T where the
        engine runs W x^T, and g U as (U^T g^T)^T by a row-major U^T where it runs g U."""
        if self.other is None:
            self.other = np.ascontiguousarray(self.b if self.few_rows else self.b.T)
        if self.few_rows:
            np.matmul(self.a, self.other, out=self.c)
        else:
            np.matmul(self.other, self.a.T, out=self.cT)
            np.copyto(self.c, self.cT.T)

    def sgemm(self):
        (ta, a, lda), (tb, b, ldb) = operand(self.a), operand(self.b)
        self.mkl.cblas_sgemm(ROW_MAJOR, ta, tb, self.M, self.N, self.K, 1.0, a, lda, b, ldb,
                             1.0 if self.add else 0.0, self.c.ctypes.data, self.N)

    def sgemm_columns(self, blocks: int = 2):
        """cblas_sgemm over ``blocks`` column blocks of C, one call a block, as two
        Python threads would split a product between them."""
        (ta, a, lda), (tb, b, ldb) = operand(self.a), operand(self.b)
        bounds = [self.N * k // blocks for k in range(blocks + 1)]
        for lo, hi in zip(bounds, bounds[1:]):
            # column lo of B: element lo of its first row, or row lo of the stored B^T
            b_lo = b + 4 * (lo if tb == NO_TRANS else lo * ldb)
            self.mkl.cblas_sgemm(ROW_MAJOR, ta, tb, self.M, hi - lo, self.K, 1.0, a, lda, b_lo,
                                 ldb, 1.0 if self.add else 0.0, self.c.ctypes.data + 4 * lo,
                                 self.N)

    def pack(self):
        size = self.mkl.cblas_sgemm_pack_get_size(B_MATRIX, self.M, self.N, self.K)
        if self.packed is None:
            self.packed = np.empty(size // 4 + 1, np.float32)
        tb, b, ldb = operand(self.b)
        self.mkl.cblas_sgemm_pack(ROW_MAJOR, B_MATRIX, tb, self.M, self.N, self.K, 1.0, b, ldb,
                                  self.packed.ctypes.data)

    def compute(self):
        ta, a, lda = operand(self.a)
        self.mkl.cblas_sgemm_compute(ROW_MAJOR, ta, PACKED, self.M, self.N, self.K, a, lda,
                                     self.packed.ctypes.data, self.N,
                                     1.0 if self.add else 0.0, self.c.ctypes.data, self.N)

    def torch(self):
        """The product as torch computes it on the same arrays: ``torch.mm`` (MKL's sgemm in
        torch's CPU wheels), ``addmm_`` where the diff is added."""
        if self.tensors is None:  # torch's own views of the arrays: the same memory
            import torch

            self.tensors = (torch.mm, *map(torch.from_numpy, (self.a, self.b, self.c)))
        mm, a, b, c = self.tensors
        if self.add:
            c.addmm_(a, b)
        else:
            mm(a, b, out=c)

    def onednn(self):
        """The product by oneDNN's packed weight: torch's ``to_mkldnn`` Linear, the weight
        reordered once (as a pack per weight update would), the rows converted to oneDNN's
        layout and the result back to NumPy's on every call, as the engine would need."""
        if self.dnnl is None:
            import torch
            from torch.utils import mkldnn

            linear = torch.nn.Linear(self.K, self.N, bias=False)
            linear.weight.data = torch.from_numpy(np.ascontiguousarray(self.b.T))
            self.dnnl = (torch, mkldnn.to_mkldnn(linear), *map(torch.from_numpy,
                                                                (self.a, self.c)))
        torch, linear, a, c = self.dnnl
        with torch.no_grad():
            c.copy_(linear(a.to_mkldnn()).to_dense())

    def result(self, run) -> bytes:
        self.c[...] = 0.0
        run()
        return self.c.tobytes()


def products(mkl, steps: int, hidden: int, batch: int, inputs: int) -> list[Product]:
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    H4 = 4 * hidden
    W, U = rand(H4, inputs), rand(H4, hidden)
    chunk = min(steps, CHUNK) * batch
    return [
        Product("x@W^T", mkl, rand(chunk, inputs), W.T, False, chunk <= 32),
        Product("h@U^T", mkl, rand(batch, hidden), U.T, False, batch <= 32),
        Product("g@U", mkl, rand(batch, H4), U, False, False),
        Product("g@W", mkl, rand(chunk, H4), W, False, False),
        Product("gU+=g'h", mkl, rand(steps * batch, H4).T, rand(steps * batch, hidden),
                True, False),
        Product("gW+=g'x", mkl, rand(steps * batch, H4).T, rand(steps * batch, inputs),
                True, False),
    ]


def set_threads(mkl, n: int) -> None:
    """This process's BLAS pools at ``n`` threads: NumPy's OpenBLAS, and MKL where loaded."""
    from threadpoolctl import ThreadpoolController

    ThreadpoolController().select(internal_api="openblas").limit(limits=n)
    if mkl is not None:
        mkl.MKL_Set_Num_Threads_Local(n)


def at_once(args) -> dict:
    """The two weight gradients of a run (U's, W's) in NumPy: one after the other on a pool
    of two threads, and at once, one on this thread and one on another, each GEMM on one
    thread: {"H T": {"series": µs, "at once": µs}} under "times"."""
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import ThreadpoolController

    openblas = ThreadpoolController().select(internal_api="openblas")
    worker = ThreadPoolExecutor(1)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    times = {}
    for H in args.hidden:
        for T in args.steps:
            gU, gW = products(None, T, H, args.batch, args.input_dim)[4:]

            def series(gU=gU, gW=gW):
                openblas.limit(limits=2)
                gU.numpy()
                gW.numpy()

            def both(gU=gU, gW=gW):
                openblas.limit(limits=1)
                other = worker.submit(gW.numpy)
                gU.numpy()
                other.result()

            calls = max(1, round(WORK / (gU.M * gU.N * gU.K + gW.M * gW.N * gW.K)))
            runs = {"series": series, "at once": both}
            times[f"{H} {T}"] = least_us_per_call(runs, clock, calls, args.rounds, warmup=2)
    return {"times": times}


def side(args) -> dict:
    """One side at one thread count, in this process: {row: {impl: µs}}, and {row: {impl:
    hash of the result}} under "hashes". A row is "H T product"."""
    if args.side == "at-once":
        return at_once(args)
    mkl = None
    if args.side == "torch":
        import torch

        torch.set_num_threads(args.threads)
    elif args.side != "numpy":
        mkl = load_mkl()
        code = mkl.MKL_CBWR_Set(CBWR[args.side])
        if code:
            return {"error": f"mkl_cbwr_set: {CBWR_ERRORS.get(code, code)}"}
    if args.side != "torch":
        set_threads(mkl, args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    times, hashes = {}, {}
    for H in args.hidden:
        for T in args.steps:
            for p in products(mkl, T, H, args.batch, args.input_dim):
                row = f"{H} {T} {p.name}"
                runs = ({"torch": p.torch} if args.side == "torch"
                        else {"numpy": p.numpy} if mkl is None else {"sgemm": p.sgemm})
                if args.side == "torch" and not p.add:
                    runs["onednn"] = p.onednn
                if args.side == "numpy" and p.few_rows:
                    runs["plain"] = p.plain
                if args.side == "numpy" and p.M <= CHUNK and not p.add:  # once a step
                    runs["relaid"] = p.relaid
                if mkl is not None and not p.add:
                    p.pack()
                    runs["packed"] = p.compute
                hashes[row] = {k: hashlib.sha1(p.result(run)).hexdigest()
                               for k, run in runs.items()}
                if mkl is not None:
                    split = hashlib.sha1(p.result(p.sgemm_columns)).hexdigest()
                    hashes[row]["split"] = "yes" if split == hashes[row]["sgemm"] else "NO"
                calls = max(1, round(WORK / (p.M * p.N * p.K)))
                times[row] = least_us_per_call(runs, clock, calls, args.rounds, warmup=2)
                if "packed" in runs:
                    times[row]["pack"] = least_us_per_call({"pack": p.pack}, clock, calls, 3,
                                                          warmup=2)["pack"]
    return {"times": times, "hashes": hashes}


def run_side(args, name: str, threads: int) -> dict:
    """One side's figures from a process of its own; an MKL side's process loads MKL's
    sequential layer at one thread and ``--layer`` at two (MKL reads
    MKL_THREADING_LAYER once, when libmkl_rt loads)."""
    env = dict(os.environ, MKL_THREADING_LAYER="SEQUENTIAL" if threads == 1 else args.layer)
    python = sys.executable
    if name == "torch":  # torch's own MKL and OpenMP pool, set by torch.set_num_threads
        env.pop("MKL_THREADING_LAYER")
        python = args.torch_python
    argv = [python, "-m", "bench.bench_gemm", "--side", name, "--threads",
            str(threads), "--hidden", *map(str, args.hidden), "--steps", *map(str, args.steps),
            "--batch", str(args.batch), "--input-dim", str(args.input_dim),
            "--rounds", str(args.rounds), "--clock", args.clock]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.splitlines()[-1])


def report(args, results: dict) -> None:
    """The median µs per call of each row, and each MKL side's ratio to NumPy's, turn by turn."""
    sides = [s for s in args.sides if s not in ("numpy", "at-once")]
    for name in sides:
        for turn in results[name, 1]:
            if "error" in turn:
                print(f"{name}: {turn['error']}; left out")
                sides.remove(name)
                break
    print(f"median {args.clock}-clock µs per call over {args.turns} turns; in brackets the "
          "median of the turns' ratios to numpy; pack: µs, once per weight update; "
          "plain: NumPy's product of a few rows as written, x W^T, not as the engine "
          "computes it (W x^T); relaid: a step's product by a row-major copy of the weight "
          "the other way round (x W^T for W x^T, (U^T g^T)^T for g U), relaid=numpy: the same "
          "bits as numpy; torch.mm: torch's product on the same arrays; onednn: by oneDNN's "
          "packed weight (torch's to_mkldnn Linear, the rows converted each call); same: "
          "the result "
          "equal bit for bit at 1 and 2 threads; "
          "split: MKL's sgemm over two column blocks equal bit for bit to one call")
    head = (f"{'H':>4} {'T':>4} {'product':9} {'thr':>3} {'numpy':>9} {'numpy plain':>17} "
            f"{'numpy relaid':>17}")
    for name in sides:
        head += (f" | {'torch.mm':>17} {'onednn':>17}" if name == "torch" else
                 f" | {name + ' sgemm':>17} {name + ' packed':>17} {'pack':>7}")
    print(head + " | same")
    rows = results["numpy", 1][0]["times"]
    for row in rows:
        H, T, product = row.split()
        for n in (1, 2):
            base = [turn["times"][row]["numpy"] for turn in results["numpy", n]]
            line = f"{H:>4} {T:>4} {product:9} {n:>3} {statistics.median(base):9.1f}"
            for name in ["numpy", *sides]:
                turns = [turn["times"][row] for turn in results[name, n]]
                for impl in IMPLS.get(name, ("sgemm", "packed")):
                    if impl not in turns[0]:
                        line += f" {'-':>17}"
                        continue
                    us = statistics.median(t[impl] for t in turns)
                    ratio = statistics.median(t[impl] / b for t, b in zip(turns, base))
                    line += f" {us:9.1f} ({ratio:4.2f}x)"
                if name in IMPLS:
                    continue
                pack = [t["pack"] for t in turns if "pack" in t]
                line += f" {statistics.median(pack):7.1f}" if pack else f" {'-':>7}"
            same = []
            for name in ("numpy", *sides):
                got = [results[name, k][0]["hashes"][row] for k in (1, 2)]
                same += [f"{name}:{impl}:{'yes' if got[0][impl] == got[1][impl] else 'NO'}"
                         for impl in got[0] if impl != "split"]
                if "relaid" in got[0]:
                    same.append("relaid=numpy:"
                                + ("yes" if got[0]["relaid"] == got[0]["numpy"] else "NO"))
                if "split" in got[0]:
                    same.append(f"{name}:split:{got[0]['split']}/{got[1]['split']}")
            print(line + (" | " + " ".join(same) if n == 2 else ""))
    if ("at-once", 2) not in results:
        return
    print(f"\nthe two weight gradients (gU, gW) of a run at two threads, NumPy: median "
          f"{args.clock}-clock µs over {args.turns} turns, in series on a pool of two or at "
          "once on two Python threads with one BLAS thread each; in brackets the median of "
          "the turns' ratios at once / in series")
    print(f"{'H':>4} {'T':>4} {'series':>9} {'at once':>17}")
    for key in results["at-once", 2][0]["times"]:
        turns = [turn["times"][key] for turn in results["at-once", 2]]
        series = statistics.median(t["series"] for t in turns)
        both = statistics.median(t["at once"] for t in turns)
        ratio = statistics.median(t["at once"] / t["series"] for t in turns)
        H, T = key.split()
        print(f"{H:>4} {T:>4} {series:9.1f} {both:9.1f} ({ratio:4.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--steps", type=int, nargs="+", default=[25, 100])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input-dim", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="rounds a side, a turn")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: the process's CPU time (meaningful at one thread)")
    parser.add_argument("--torch-python", default=sys.executable,
                        help="a Python with torch for the torch side (default: this one)")
    parser.add_argument("--sides", nargs="+", choices=["numpy", *CBWR, "torch", "at-once"],
                        default=["numpy", "off", "strict", "at-once"],
                        help="at-once: the weight gradients in series or at once (NumPy)")
    parser.add_argument("--layer", choices=["GNU", "INTEL", "TBB"], default="GNU",
                        help="MKL's threading layer at two threads (one: SEQUENTIAL)")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(side(args)))
        return
    if "numpy" not in args.sides:
        args.sides.insert(0, "numpy")
    if set(args.sides) & set(CBWR) and mkl_path() is None:
        sys.exit(f"bench_gemm: no libmkl_rt in {Path(sys.prefix) / 'lib'} for the MKL sides: "
                 "pip install mkl, or --sides numpy at-once")
    results = {}
    for turn in range(args.turns):
        for n in (1, 2):
            for name in args.sides:
                if name != "at-once" or n == 2:
                    results.setdefault((name, n), []).append(run_side(args, name, n))
        print(f"turn {turn + 1} of {args.turns} done", file=sys.stderr)
    report(args, results)


if __name__ == "__main__":
    main()
