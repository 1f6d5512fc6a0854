"""InnerProduct: a fully connected layer, Caffe's semantics and blob layout."""

from __future__ import annotations

import math

import numpy as np

from unroll.engine.layer import Layer, register_layer
from unroll.engine.memory.weight_gradients import time_chunks
from unroll.engine.memory_traits import BatchedParamGradient, MemoryTraits

#: up to this many rows (an unrolled timestep's batch), x (M, K) times a transposed weight
#: view runs on the CPU as the transposed product W x^T written back through a scratch
#: array: OpenBLAS multiplies a few rows by a transposed operand slowly. At M = 32 the
#: product takes 0.53-0.87x the time for K = 64..512, 4K outputs, one thread (0.75x at
#: K = 512 with two); at M = 64 it breaks even (bench/bench_lstm.py has the step's figures)
FEW_ROWS = 32
#: ...and only when both sides of the weights are at least this wide: below it the product
#: is too small to be slow, and the scratch copy back costs more than it saves
#: (bench/bench_dispatch.py, N = D = H = 1)
FEW_ROWS_MIN_WIDTH = 64


@register_layer("InnerProduct")
class InnerProductLayer(Layer):
    """y = x W^T + b, x viewed as (M, K) at ``axis``; W (num_output, K) or (K, num_output).

    When several InnerProducts share W (the timesteps of an unrolled net), the
    net may place their x rows and top-diff rows back to back and compute the
    param gradient of all of them in one GEMM (:meth:`param_backward`); each
    one's backward then computes only its bottom's diff. A lone InnerProduct from axis 2
    on, over T timesteps (axis 0), sums its param gradient by chunks of time
    (:func:`~unroll.engine.memory.time_chunks`), as the same rows split into one layer a
    chunk would, and runs its products by the same chunks (docs/design.md, 6. Memory,
    chunks of time).
    """

    param_blobs = ("weight (num_output, K), or (K, num_output) with transpose",
                   "bias (num_output,), with bias_term")
    #: its param gradient is a GEMM over rows, which a net may batch over sharers: layers
    #: with the same param blobs and transpose, rows x of width K and gy of num_output
    memory = MemoryTraits(batched_param_gradient=BatchedParamGradient(
        key=lambda ip: (tuple(map(id, ip.blobs)), ip.transpose),
        row_widths=lambda ip: (ip.K, ip.num_output),
        backward=lambda ip, x, gy: ip.param_backward(x, gy)))

    def layer_setup(self, bottoms, tops):
        p = self.param.inner_product_param
        self.num_output = p.num_output
        if self.num_output < 1:
            raise self.error(f"inner_product_param.num_output must be >= 1, found {p.num_output}")
        self.bias_term, self.transpose, self.axis = p.bias_term, p.transpose, p.axis
        shape = bottoms[0].shape
        self.K = math.prod(shape[self.canonical_axis(self.axis, len(shape)) :])
        wshape = (self.K, self.num_output) if self.transpose else (self.num_output, self.K)
        self.param_blob(wshape, p.weight_filler)
        if self.bias_term:
            self.param_blob((self.num_output,), p.bias_filler)

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        axis = self.canonical_axis(self.axis, len(shape))
        K = math.prod(shape[axis:])
        if K != self.K:
            raise self.error(
                f"bottom '{bottoms[0].name}' of shape {shape} gives {K} inputs per row from "
                f"axis {axis}; the weights expect K = {self.K}"
            )
        self.M = math.prod(shape[:axis])
        per_step = self.M // shape[0] if axis >= 2 and shape[0] else 0
        rows = ([slice(r.start * per_step, r.stop * per_step) for r in time_chunks(shape[0])]
                if per_step else [slice(0, self.M)])
        tops[0].reshape(shape[:axis] + (self.num_output,))
        # each chunk of time's products as that chunk's own layer would take them, so a loss
        # run by chunks gives the same bits (docs/design.md, 6. Memory)
        wide = self.xp is np and min(self.K, self.num_output) >= FEW_ROWS_MIN_WIDTH
        self.time_rows = [(r, wide and r.stop - r.start <= FEW_ROWS) for r in rows]
        few = [r.stop - r.start for r, is_few in self.time_rows if is_few]
        self.few_rows = bool(few)
        if few:  # the transposed products of forward (y) and backward (gx), the most rows
            if not self.transpose:
                self.reserve("yT", (self.num_output * max(few),), lives="forward")
            else:
                self.reserve("gxT", (self.K * max(few),), lives="backward")

    def _products(self, a, out, direct: bool, scratch: str) -> None:
        """out = a W if ``direct``, else a W^T, by chunk of time; a W^T of few rows as
        (W a^T)^T, through scratch array ``scratch``."""
        W = self.blobs[0].data
        for rows, few in self.time_rows:
            if direct:
                self.xp.matmul(a[rows], W, out=out[rows])
            elif few:
                t = self.scratch(scratch)[:W.shape[0] * (rows.stop - rows.start)]
                t = t.reshape(W.shape[0], -1)
                np.matmul(W, a[rows].T, out=t)
                np.copyto(out[rows], t.T)
            else:
                self.xp.matmul(a[rows], W.T, out=out[rows])

    def forward(self, bottoms, tops):
        y = tops[0].data.reshape(self.M, self.num_output)
        self._products(bottoms[0].data.reshape(self.M, self.K), y, self.transpose, "yT")
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, tops, propagate_down, bottoms):
        gy = tops[0].diff.reshape(self.M, self.num_output)
        if not self.param_diffs_batched:
            x = bottoms[0].data.reshape(self.M, self.K)
            for rows, _ in self.time_rows:
                self.param_backward(x[rows], gy[rows])
        if propagate_down[0]:
            self._products(gy, bottoms[0].diff.reshape(self.M, self.K), not self.transpose,
                          "gxT")

    def param_backward(self, x, gy):
        """Add the param gradients of rows ``x`` (M, K) and top diffs ``gy`` (M, num_output)."""
        W = self.blobs[0]
        W.diff += x.T @ gy if self.transpose else gy.T @ x
        if self.bias_term:
            self.blobs[1].diff += gy.sum(axis=0)
