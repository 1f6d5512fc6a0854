"""Reduction: the sum, absolute sum, sum of squares or mean of every axis from ``axis`` on
(Caffe's ReductionLayer)."""

from __future__ import annotations

import math

from unroll.core._generated.unroll_pb2 import ReductionParameter
from unroll.engine.layer import Layer, register_layer

SUM, ASUM, SUMSQ, MEAN = (ReductionParameter.SUM, ReductionParameter.ASUM,
                          ReductionParameter.SUMSQ, ReductionParameter.MEAN)


@register_layer("Reduction")
class ReductionLayer(Layer):
    """y = coeff * op(x over axes [axis, end)), shape x.shape[:axis]; op SUM, ASUM (of |x|),
    SUMSQ (of x ** 2) or MEAN.

    As Caffe's: ``reduction_param { operation axis coeff }`` (SUM, axis 0, coeff 1 by
    default), and Caffe reduces every axis from ``axis`` on, not that axis alone: axis 0
    gives a scalar. A reduction over other axes is a Reshape (or a Scale by ones) away.

    >>> from unroll.testing import run_layer
    >>> import numpy as np
    >>> _, _, (y,) = run_layer('type: "Reduction" reduction_param { operation: MEAN axis: 1 }',
    ...                        [np.array([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0]])])
    >>> y.data.tolist()
    [2.0, 4.0]
    """

    def __init__(self, param, *args, **kwargs):
        super().__init__(param, *args, **kwargs)
        self.op = param.reduction_param.operation

    @property
    def backward_reads(self) -> tuple:
        """SUM, MEAN: nothing (the gradient is a constant); ASUM, SUMSQ: the bottom."""
        # fixed by the LayerParameter, so known before set-up like a class attribute
        return ("bottom",) if self.op in (ASUM, SUMSQ) else ()

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        self.axis = self.canonical_axis(self.param.reduction_param.axis, len(shape)) \
            if shape else 0
        self.view = (math.prod(shape[:self.axis]), math.prod(shape[self.axis:]))
        tops[0].reshape(shape[:self.axis])

    def forward(self, bottoms, tops):
        xp, coeff = self.xp, self.param.reduction_param.coeff
        x = bottoms[0].data.reshape(self.view)
        if self.op == ASUM:
            x = xp.abs(x)
        elif self.op == SUMSQ:
            x = x * x
        y = x.sum(axis=1)
        scale = coeff / self.view[1] if self.op == MEAN else coeff
        tops[0].data[...] = (y * scale).reshape(tops[0].shape)

    def backward(self, tops, propagate_down, bottoms):
        if not propagate_down[0]:
            return
        xp, coeff = self.xp, self.param.reduction_param.coeff
        gy = tops[0].diff.reshape(self.view[0], 1)
        gx = bottoms[0].diff.reshape(self.view)
        if self.op == SUM:
            gx[...] = coeff * gy
        elif self.op == MEAN:
            gx[...] = (coeff / self.view[1]) * gy
        elif self.op == ASUM:
            xp.multiply(xp.sign(bottoms[0].data.reshape(self.view)), coeff * gy, out=gx)
        else:
            xp.multiply(bottoms[0].data.reshape(self.view), 2 * coeff * gy, out=gx)
