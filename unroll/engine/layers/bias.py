"""Bias: add a learned (or given) bias, broadcast over the other axes (Caffe's BiasLayer)."""

from __future__ import annotations

import math

from unroll.engine.layer import Layer, register_layer


@register_layer("Bias")
class BiasLayer(Layer):
    """y = x + b, b of shape x.shape[axis:axis+num_axes]; b learned, or bottom[1].

    As Caffe's: ``bias_param { axis num_axes filler }`` (axis 1, num_axes 1,
    filler constant 0 by default; num_axes -1 means every axis from ``axis``).
    With two bottoms the bias is bottom[1] and its shape gives num_axes.

    >>> from unroll.testing import run_layer
    >>> import numpy as np
    >>> _, _, (y,) = run_layer('type: "Bias" bias_param { filler { type: "constant" value: 2 } }',
    ...                        [np.zeros((1, 3))])
    >>> y.data.tolist()
    [[2.0, 2.0, 2.0]]
    """

    num_bottoms = (1, 2)
    in_place = True
    param_blobs = ("bias (x.shape[axis:axis + num_axes]), with one bottom",)
    # the gradient is the top diff itself: backward reads no data
    backward_reads = ()

    def layer_setup(self, bottoms, tops):
        p = self.param.bias_param
        self.axis, self.bias_shape = operand_shape(self, bottoms, p, "bias")
        if len(bottoms) == 1:
            self.param_blob(self.bias_shape, p.filler)

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        if len(bottoms) == 2:
            self.bias_shape = bottoms[1].shape
        self.view = operand_view(self, bottoms, self.axis, self.bias_shape, "bias")
        tops[0].reshape(shape)

    def _bias(self, bottoms):
        return bottoms[1] if len(bottoms) == 2 else self.blobs[0]

    def forward(self, bottoms, tops):
        x, y = bottoms[0].data, tops[0].data
        if y is not x:
            self.xp.copyto(y, x)
        y.reshape(self.view)[...] += self._bias(bottoms).data.reshape(1, -1, 1)

    def backward(self, tops, propagate_down, bottoms):
        gy = tops[0].diff
        # the bias gradient first: in place, the bottom diff is the top diff's memory
        if len(bottoms) == 1 or propagate_down[1]:
            gb = gy.reshape(self.view).sum(axis=(0, 2)).reshape(self.bias_shape)
            if len(bottoms) == 2:
                bottoms[1].diff[...] = gb
            else:
                self.blobs[0].diff += gb
        if propagate_down[0] and bottoms[0].diff is not gy:
            bottoms[0].diff[...] = gy


def operand_shape(layer, bottoms, param, what: str) -> tuple[int, tuple]:
    """(axis, shape) of the operand of Caffe's Bias and Scale layers (``what``): bottom 1's
    shape at ``param.axis`` of bottom 0 (axis 0 for a scalar), or else ``param.num_axes``
    axes of bottom 0 from ``param.axis`` (-1: to the end), as a learned param."""
    shape = bottoms[0].shape
    if len(bottoms) == 2:
        k = bottoms[1].ndim
        axis = 0 if k == 0 else layer.canonical_axis(param.axis, len(shape))
    else:
        axis = layer.canonical_axis(param.axis, len(shape))
        if param.num_axes < -1:
            raise layer.error(f"{what}_param.num_axes must be >= -1, found {param.num_axes}")
        k = len(shape) - axis if param.num_axes == -1 else param.num_axes
    if axis + k > len(shape):
        raise layer.error(f"a {k}-D {what} at axis {axis} does not fit bottom "
                          f"'{bottoms[0].name}' of shape {shape}")
    return axis, shape[axis : axis + k]


def operand_view(layer, bottoms, axis: int, operand: tuple, what: str) -> tuple:
    """(outer, operand count, inner): bottom 0 seen as 3-D around the operand of a Bias or
    Scale layer, after checking that the operand's shape is bottom 0's from ``axis``."""
    shape = bottoms[0].shape
    found = shape[axis : axis + len(operand)]
    if found != operand:
        raise layer.error(f"bottom '{bottoms[0].name}' of shape {shape} has {found} from axis "
                          f"{axis}; the {what} has shape {operand}")
    return (math.prod(shape[:axis]), math.prod(found), math.prod(shape[axis + len(operand):]))
