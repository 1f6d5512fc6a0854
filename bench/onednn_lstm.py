"""oneDNN's LSTM primitive (the fused layer PyTorch's CPU ``nn.LSTM`` runs), driven through
its C API with ctypes: one training step over all T timesteps, forward and backward.

It loads ``libdnnl`` from the ``onednn-cpu-gomp`` wheel (``pip install
onednn-cpu-gomp``: oneDNN 3.2, CPU only, on GNU OpenMP, its threads set by
``OMP_NUM_THREADS``; ``ONEDNN_LIB`` names another libdnnl). The ``onednn`` wheel is a
SYCL build: its CPU engine needs Intel's OpenCL runtime and runs the RNN's reference
kernels, so it is not the one to time.

The weights live in oneDNN's plain layout (ldigo: gates i, f, c~, o), where a solver
would update them, and are reordered into the forward's and the backward's packed
layouts at every step; the backward writes the weight gradients in the plain layout.
``bench/bench_lstm.py``'s side ``onednn`` times a step against ``nn.LSTM``.

    >>> lstm = OneDnnLstm(steps=25, batch=32, input_dim=100, hidden=128)  # doctest: +SKIP
    >>> lstm.x[:] = x.ravel(); lstm.step(target, lr=0.01)                 # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

P, INT, UINT, DIMS = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_int64 * 12
# dnnl_types.h: the values of the enums and execute arguments used here
CPU, IN_ORDER, F32 = 1, 1, 3
TAG_ANY, TAG_ABC, TAG_ABCD, TAG_ABCDE = 1, 4, 5, 6
FORWARD_TRAINING, BACKWARD, LEFT2RIGHT = 64, 128, 1
QUERY_EXEC_ARG_MD = 255
SRC, SRC_ITER, SRC_ITER_C, DST, WORKSPACE = 1, 2, 3, 17, 64
WEIGHTS_LAYER, WEIGHTS_ITER, BIAS = 33, 34, 41
DIFF_SRC, DIFF_SRC_ITER, DIFF_SRC_ITER_C, DIFF_DST = 129, 130, 131, 145
DIFF_WEIGHTS_LAYER, DIFF_WEIGHTS_ITER, DIFF_BIAS = 161, 162, 169
STATUS = ["success", "out_of_memory", "invalid_arguments", "unimplemented",
          "last_impl_reached", "runtime_error", "not_required"]
ALLOCATE = P(ctypes.c_size_t(-1).value)  # DNNL_MEMORY_ALLOCATE


class Arg(ctypes.Structure):
    _fields_ = [("arg", INT), ("memory", P)]


class Memory(NamedTuple):
    handle: P
    array: np.ndarray  # float32, over the memory's bytes


def library_path() -> Path | None:
    """libdnnl of the ``onednn-cpu-gomp`` wheel beside this interpreter's lib/, or
    ``ONEDNN_LIB``."""
    if os.environ.get("ONEDNN_LIB"):
        return Path(os.environ["ONEDNN_LIB"])
    path = Path(sys.prefix) / "lib" / "libdnnl.so.3"
    return path if path.exists() else None


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.dnnl_primitive_desc_query_md.restype = P
    lib.dnnl_primitive_desc_query_md.argtypes = [P, INT, INT]
    lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
    lib.dnnl_memory_desc_get_size.argtypes = [P]
    lib.dnnl_lstm_forward_primitive_desc_create.argtypes = [P, P, INT, INT, *[P] * 11, UINT, P]
    lib.dnnl_lstm_backward_primitive_desc_create.argtypes = [P, P, INT, INT, *[P] * 22, UINT,
                                                             P, P]
    lib.dnnl_memory_create.argtypes = [P] * 4
    lib.dnnl_reorder_primitive_desc_create.argtypes = [P] * 6
    lib.dnnl_primitive_execute.argtypes = [P, P, INT, P]
    return lib


class OneDnnLstm:
    """One unidirectional LSTM layer, T steps of N rows, D inputs, H hidden, float32,
    zero initial state, loss sum((h - target)^2) / 2N, plain SGD."""

    def __init__(self, steps: int, batch: int, input_dim: int, hidden: int, seed: int = 0):
        path = library_path()
        if path is None:
            raise FileNotFoundError(f"no libdnnl.so.3 in {Path(sys.prefix) / 'lib'}: "
                                    "pip install onednn-cpu-gomp, or set ONEDNN_LIB")
        self.lib = load(path)
        T, N, D, H = self.shape = (steps, batch, input_dim, hidden)
        self.engine = self._out("dnnl_engine_create", CPU, 0)
        self.stream = self._out("dnnl_stream_create", self.engine, IN_ORDER)
        md = self._md
        src, dst, state, bias = md(T, N, D), md(T, N, H), md(1, 1, N, H), md(1, 1, 4, H)
        dims = {WEIGHTS_LAYER: (1, 1, D, 4, H), WEIGHTS_ITER: (1, 1, H, 4, H)}
        plain = {arg: md(*shape) for arg, shape in dims.items()}
        packed = {arg: md(*shape, tag=TAG_ANY) for arg, shape in dims.items()}
        # the initial states are passed as zeros: without them oneDNN 3.2's backward reads
        # h_{-1} from memory it never wrote, and U's gradient comes out wrong
        forward = self._out("dnnl_lstm_forward_primitive_desc_create", self.engine,
                            FORWARD_TRAINING, LEFT2RIGHT, src, state, state,
                            packed[WEIGHTS_LAYER], packed[WEIGHTS_ITER], None, None, bias, dst,
                            None, None, 0, None)
        backward = self._out("dnnl_lstm_backward_primitive_desc_create", self.engine, BACKWARD,
                             LEFT2RIGHT, src, state, state, packed[WEIGHTS_LAYER],
                             packed[WEIGHTS_ITER], None, None, bias, dst, None, None,
                             src, state, state, plain[WEIGHTS_LAYER], plain[WEIGHTS_ITER],
                             None, None, bias, dst, None, None, 0, forward, None)
        self.forward_primitive = self._out("dnnl_primitive_create", forward)
        self.backward_primitive = self._out("dnnl_primitive_create", backward)
        m = {name: self._memory(desc) for name, desc in [
            ("x", src), ("h", dst), ("dx", src), ("dh", dst), ("bias", bias), ("dbias", bias),
            ("h0", state), ("c0", state), ("dh0", state), ("dc0", state),
            ("workspace", self._query(forward, WORKSPACE))]}
        rng = np.random.default_rng(seed)
        bound = 1 / np.sqrt(H)
        self.weights, self.grads, self.packs = {}, {}, []
        for arg in dims:
            self.weights[arg], self.grads[arg] = self._memory(plain[arg]), self._memory(plain[arg])
            self.weights[arg].array[:] = rng.uniform(-bound, bound, self.weights[arg].array.size)
            for pd, use in [(forward, "forward"), (backward, "backward")]:
                m[use, arg] = self._memory(self._query(pd, arg))
                self.packs.append((self._reorder(plain[arg], self._query(pd, arg)),
                                   self.weights[arg], m[use, arg]))
        for name in ("bias", "h0", "c0"):
            m[name].array[:] = 0
        self.x, self.h, self.dh = (m[k].array[:n] for k, n in
                                   [("x", T * N * D), ("h", T * N * H), ("dh", T * N * H)])
        self.bias, self.dbias = m["bias"].array[:4 * H], m["dbias"].array[:4 * H]
        common = [(SRC, m["x"]), (SRC_ITER, m["h0"]), (SRC_ITER_C, m["c0"]), (BIAS, m["bias"]),
                  (DST, m["h"]), (WORKSPACE, m["workspace"])]
        self.forward_args = [*common, (WEIGHTS_LAYER, m["forward", WEIGHTS_LAYER]),
                             (WEIGHTS_ITER, m["forward", WEIGHTS_ITER])]
        self.backward_args = [*common, (WEIGHTS_LAYER, m["backward", WEIGHTS_LAYER]),
                              (WEIGHTS_ITER, m["backward", WEIGHTS_ITER]), (DIFF_DST, m["dh"]),
                              (DIFF_SRC, m["dx"]), (DIFF_SRC_ITER, m["dh0"]),
                              (DIFF_SRC_ITER_C, m["dc0"]), (DIFF_BIAS, m["dbias"]),
                              (DIFF_WEIGHTS_LAYER, self.grads[WEIGHTS_LAYER]),
                              (DIFF_WEIGHTS_ITER, self.grads[WEIGHTS_ITER])]

    def _check(self, status: int, call: str) -> None:
        if status:
            name = STATUS[status] if status < len(STATUS) else str(status)
            raise RuntimeError(f"oneDNN {call}: {name}")

    def _out(self, call: str, *args):
        """The handle that C function ``call`` writes through its first argument."""
        handle = P()
        self._check(getattr(self.lib, call)(ctypes.byref(handle), *args), call)
        return handle

    def _md(self, *dims: int, tag: int | None = None):
        """A float32 memory descriptor, plain (row-major) unless ``tag`` says otherwise."""
        tag = tag or {3: TAG_ABC, 4: TAG_ABCD, 5: TAG_ABCDE}[len(dims)]
        return self._out("dnnl_memory_desc_create_with_tag", len(dims), DIMS(*dims), F32, tag)

    def _query(self, pd, arg):
        return self.lib.dnnl_primitive_desc_query_md(pd, QUERY_EXEC_ARG_MD, arg)

    def _memory(self, desc) -> Memory:
        """A memory oneDNN allocates for ``desc``."""
        memory = self._out("dnnl_memory_create", desc, self.engine, ALLOCATE)
        data = P()
        self._check(self.lib.dnnl_memory_get_data_handle(memory, ctypes.byref(data)),
                    "dnnl_memory_get_data_handle")
        count = max(self.lib.dnnl_memory_desc_get_size(desc) // 4, 1)
        pointer = ctypes.cast(data, ctypes.POINTER(ctypes.c_float))
        return Memory(memory, np.ctypeslib.as_array(pointer, shape=(count,)))

    def _reorder(self, src_desc, dst_desc):
        pd = self._out("dnnl_reorder_primitive_desc_create", src_desc, self.engine, dst_desc,
                       self.engine, None)
        return self._out("dnnl_primitive_create", pd)

    def _run(self, primitive, args) -> None:
        pairs = (Arg * len(args))(*(Arg(arg, memory.handle) for arg, memory in args))
        self._check(self.lib.dnnl_primitive_execute(primitive, self.stream, len(args), pairs),
                    "dnnl_primitive_execute")
        self._check(self.lib.dnnl_stream_wait(self.stream), "dnnl_stream_wait")

    def forward(self) -> np.ndarray:
        """h of every step, (T, N, H), from ``x`` and the plain weights."""
        for reorder, plain, packed in self.packs:
            self._run(reorder, [(SRC, plain), (DST, packed)])
        self._run(self.forward_primitive, self.forward_args)
        T, N, _, H = self.shape
        return self.h.reshape(T, N, H)

    def step(self, target: np.ndarray, lr: float) -> None:
        """One SGD step on sum((h - target)^2) / 2N."""
        h = self.forward()
        np.subtract(h, target, out=self.dh.reshape(h.shape))
        self.dh *= 1 / self.shape[1]
        for grad in self.grads.values():  # the backward adds into its diffs
            grad.array[:] = 0
        self.dbias[:] = 0
        self._run(self.backward_primitive, self.backward_args)
        for arg, weight in self.weights.items():
            weight.array[:] -= lr * self.grads[arg].array
        self.bias -= lr * self.dbias


def reference_h(lstm: OneDnnLstm, weights=None) -> np.ndarray:
    """The same forward in float64 NumPy, from the plain weights (gates i, f, c~, o) or
    ``weights`` = (wx (D, 4H), wh (H, 4H), bias (4H,))."""
    T, N, D, H = lstm.shape
    x = lstm.x.reshape(T, N, D).astype(np.float64)
    wx, wh, bias = weights or plain_weights(lstm)
    h, c, out = np.zeros((N, H)), np.zeros((N, H)), []
    for t in range(T):
        g = x[t] @ wx + h @ wh + bias
        i, f, o = (1 / (1 + np.exp(-g[:, k * H:(k + 1) * H])) for k in (0, 1, 3))
        c = f * c + i * np.tanh(g[:, 2 * H:3 * H])
        h = o * np.tanh(c)
        out.append(h)
    return np.array(out)


def plain_weights(lstm: OneDnnLstm) -> list[np.ndarray]:
    """Views of wx (D, 4H), wh (H, 4H) and the bias (4H,)."""
    _, _, D, H = lstm.shape
    return [lstm.weights[WEIGHTS_LAYER].array.reshape(D, 4 * H),
            lstm.weights[WEIGHTS_ITER].array.reshape(H, 4 * H), lstm.bias]


def gradient_error(seed: int = 0) -> float:
    """The largest difference between the gradients of one step of a small OneDnnLstm and
    central differences of its loss in float64, relative to the largest gradient."""
    T, N, D, H = 5, 3, 4, 6
    lstm = OneDnnLstm(T, N, D, H, seed=seed)
    rng = np.random.default_rng(seed)
    lstm.x[:] = rng.standard_normal(lstm.x.size)
    lstm.bias[:] = rng.uniform(-0.5, 0.5, 4 * H)
    target = rng.standard_normal((T, N, H)).astype(np.float32)
    before = [w.astype(np.float64) for w in plain_weights(lstm)]
    lstm.step(target, lr=1.0)  # so each weight moves by minus its gradient
    eps, worst, scale = 1e-6, 0.0, 0.0
    for k, after in enumerate(plain_weights(lstm)):
        grad = before[k] - after
        for index in np.ndindex(grad.shape):
            loss = []
            for sign in (1, -1):
                shifted = [w.copy() for w in before]
                shifted[k][index] += sign * eps
                loss.append(((reference_h(lstm, shifted) - target) ** 2).sum() / (2 * N))
            worst = max(worst, abs((loss[0] - loss[1]) / (2 * eps) - grad[index]))
            scale = max(scale, abs(grad[index]))
    return worst / scale
