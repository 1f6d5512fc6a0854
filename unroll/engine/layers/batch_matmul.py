"""BatchMatMul: per batch column, a time-major memory times a vector (attention scores),
or weights over time times the memory (attention contexts)."""

from __future__ import annotations

from unroll.engine.layer import Layer, register_layer


@register_layer("BatchMatMul")
class BatchMatMulLayer(Layer):
    """For each batch column n, the product of the matrix ``M[:, n, :]`` (S, H) of a
    time-major memory M (S, N, H) with a vector, on the side the bottoms' order says:

    - ``bottom: M bottom: q``, q (N, H): ``y[s, n] = sum_h M[s, n, h] q[n, h]``, (S, N):
      the dot-product scores of a query against every memory step;
    - ``bottom: a bottom: M``, a (S, N): ``y[n, h] = sum_s a[s, n] M[s, n, h]``, (N, H):
      the context, the memory's steps weighted by a.

    unroll's own type (no params, no proto fields); ``unroll expand --caffe`` lowers it to
    Caffe's Scale, Reduction, Slice, Eltwise and Reshape (docs/design.md, Caffe export).

    >>> from unroll.testing import run_layer
    >>> import numpy as np
    >>> memory = np.arange(12.0).reshape(3, 2, 2)
    >>> _, _, (scores,) = run_layer('type: "BatchMatMul"', [memory, np.array([[1.0, 0], [0, 1]])])
    >>> scores.data.tolist()
    [[0.0, 3.0], [4.0, 7.0], [8.0, 11.0]]
    >>> _, _, (context,) = run_layer('type: "BatchMatMul"', [np.ones((3, 2)), memory])
    >>> context.data.tolist()
    [[12.0, 15.0], [18.0, 21.0]]
    """

    num_bottoms = (2, 2)

    def reshape(self, bottoms, tops):
        a, b = bottoms[0].shape, bottoms[1].shape
        if len(a) == 3 and len(b) == 2 and a[1:] == b:
            self.scores = True
            tops[0].reshape(a[:2])
        elif len(a) == 2 and len(b) == 3 and b[:2] == a:
            self.scores = False
            tops[0].reshape(b[1:])
        else:
            raise self.error(
                f"bottoms '{bottoms[0].name}' {a} and '{bottoms[1].name}' {b} are neither a "
                f"memory (S, N, H) and a query (N, H) nor weights (S, N) and a memory (S, N, H)")

    def forward(self, bottoms, tops):
        xp, a, b = self.xp, bottoms[0].data, bottoms[1].data
        if self.scores:
            tops[0].data[...] = xp.einsum("snh,nh->sn", a, b)
        else:
            tops[0].data[...] = xp.einsum("sn,snh->nh", a, b)

    def backward(self, tops, propagate_down, bottoms):
        xp, gy = self.xp, tops[0].diff
        a, b = bottoms[0].data, bottoms[1].data
        if self.scores:  # a = M (S, N, H), b = q (N, H)
            if propagate_down[0]:
                xp.multiply(gy[:, :, None], b[None], out=bottoms[0].diff)
            if propagate_down[1]:
                bottoms[1].diff[...] = xp.einsum("sn,snh->nh", gy, a)
        else:  # a = weights (S, N), b = M (S, N, H)
            if propagate_down[0]:
                bottoms[0].diff[...] = xp.einsum("nh,snh->sn", gy, b)
            if propagate_down[1]:
                xp.multiply(a[:, :, None], gy[None], out=bottoms[1].diff)
