"""Reshape and Flatten: a new shape over the same values, without a copy.

As in Caffe, the top's data and diff are reshaped views of the bottom's, so
forward and backward move no memory. The top follows the bottom's memory
wherever a net places it (:meth:`unroll.engine.blob.Blob.view_of`); only a bottom
made non-contiguous from outside is copied instead.
"""

from __future__ import annotations

import math

from unroll.engine.layer import Layer, register_layer
from unroll.engine.memory_traits import MemoryTraits


class ViewLayer(Layer):
    """One bottom, one top holding the same values in shape ``top_shape(bottom shape)``."""

    backward_reads = ()
    #: the top's data and diff are views of the bottom's (no copy)
    memory = MemoryTraits(shares_bottom=("data", "diff"))

    def top_shape(self, shape) -> tuple:
        raise NotImplementedError

    def reshape(self, bottoms, tops):
        x, y = bottoms[0], tops[0]
        shape = self.top_shape(x.shape)
        if math.prod(shape) != x.count:
            raise self.error(f"top shape {shape} does not hold the {x.count} values of "
                             f"bottom '{x.name}' {x.shape}")
        y.reshape(shape)
        y.view_of(x)  # follows x's memory wherever the net puts it

    # a non-contiguous bottom (set from outside) cannot be viewed: the top's arrays
    # are then copies, refreshed here
    def forward(self, bottoms, tops):
        x, y = bottoms[0], tops[0]
        if not x.data.flags.c_contiguous:
            y.data[...] = x.data.reshape(y.shape)

    def backward(self, tops, propagate_down, bottoms):
        x, y = bottoms[0], tops[0]
        if propagate_down[0] and not x.diff.flags.c_contiguous:
            x.diff[...] = y.diff.reshape(x.shape)


@register_layer("Reshape")
class ReshapeLayer(ViewLayer):
    """y = x with axes [axis, axis + num_axes) reshaped to shape.dim (0 copies, -1 infers)."""

    def top_shape(self, shape):
        p, ndim = self.param.reshape_param, len(shape)
        start = p.axis if p.axis >= 0 else ndim + p.axis + 1
        if not 0 <= start <= ndim:
            raise self.error(f"axis {p.axis} out of range for bottom shape {shape}")
        if p.num_axes < -1:
            raise self.error(f"num_axes must be >= -1, found {p.num_axes}")
        end = ndim if p.num_axes == -1 else start + p.num_axes
        if end > ndim:
            raise self.error(f"axis {p.axis} + num_axes {p.num_axes} exceed bottom shape {shape}")
        dims = list(p.shape.dim)
        infer = [i for i, d in enumerate(dims) if d == -1]
        if len(infer) > 1 or any(d < -1 for d in dims):
            raise self.error(f"shape {dims}: dims must be >= 0, or one -1 to infer")
        for i, d in enumerate(dims):
            if d == 0:
                if start + i >= ndim:
                    raise self.error(f"shape {dims}: dim 0 at {i} copies axis {start + i}, "
                                     f"which bottom shape {shape} lacks")
                dims[i] = shape[start + i]
        out = [*shape[:start], *dims, *shape[end:]]
        if infer:
            known = -math.prod(out)
            total = math.prod(shape)
            if known == 0 or total % known:
                raise self.error(f"shape {list(p.shape.dim)}: cannot infer the -1 dim for "
                                 f"bottom shape {shape}")
            out[start + infer[0]] = total // known
        return tuple(out)


@register_layer("Flatten")
class FlattenLayer(ViewLayer):
    """y = x with axes [axis, end_axis] merged into one; shape (..., prod(merged), ...)."""

    def top_shape(self, shape):
        p, ndim = self.param.flatten_param, len(shape)
        start = self.canonical_axis(p.axis, ndim)
        end = self.canonical_axis(p.end_axis, ndim)
        if end < start - 1:
            raise self.error(f"end_axis {p.end_axis} precedes axis {p.axis} "
                             f"for bottom shape {shape}")
        return (*shape[:start], math.prod(shape[start:end + 1]), *shape[end + 1:])
