"""BatchNorm (Caffe's: normalization only, no affine part) and Scale (y = x * s + b)."""

from __future__ import annotations

import math

from unroll.core.proto import FillerParameter
from unroll.engine.layer import Layer, register_layer
from unroll.engine.layers.bias import operand_shape, operand_view
from unroll.engine.memory_traits import MemoryTraits


@register_layer("BatchNorm")
class BatchNormLayer(Layer):
    """y = (x - mean_c) / sqrt(var_c + eps), c on axis 1; blobs mean (C,), var (C,), factor (1,)."""

    memory = MemoryTraits(recomputable=False)  # its forward updates the running statistics

    in_place = True
    same_shape = True
    learnable = False
    param_blobs = ("mean (C,)", "variance (C,)", "moving average factor (1,)")
    # backward reads x_norm and 1 / std saved in forward, never the (overwritten) bottom
    backward_reads = ()

    def layer_setup(self, bottoms, tops):
        p = self.param.batch_norm_param
        self.use_global = (
            p.use_global_stats if p.HasField("use_global_stats") else self.phase == "test"
        )
        self.fraction, self.eps = p.moving_average_fraction, p.eps
        shape = bottoms[0].shape
        if not shape:
            raise self.error(
                f"bottom '{bottoms[0].name}' must have at least one axis, found {shape}"
            )
        self.C = shape[1] if len(shape) > 1 else 1
        for s in ((self.C,), (self.C,), (1,)):
            self.param_blob(s)
        self.x_norm = self.inv_std = None

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        C = shape[1] if len(shape) > 1 else 1
        if C != self.C:
            raise self.error(
                f"bottom '{bottoms[0].name}' of shape {shape} has {C} channels on axis 1; "
                f"the statistics hold {self.C}"
            )
        self.view = (shape[0], C, math.prod(shape[2:]))
        tops[0].reshape(shape)
        if not self.use_global and (self.x_norm is None or self.x_norm.shape != self.view):
            self.x_norm = self.xp.zeros(self.view, self.dtype)

    def forward(self, bottoms, tops):
        xp = self.xp
        x, y = bottoms[0].data.reshape(self.view), tops[0].data.reshape(self.view)
        mean_b, var_b, factor_b = (b.data for b in self.blobs)
        if self.use_global:
            factor = float(factor_b[0])
            scale = 0.0 if factor == 0 else 1.0 / factor
            mean, var = mean_b * scale, var_b * scale
            xp.subtract(x, mean[:, None], out=y)
        else:
            mean = x.mean(axis=(0, 2))
            xp.subtract(x, mean[:, None], out=y)
            var = xp.square(y, out=self.x_norm).mean(axis=(0, 2))
            m = y.size // self.C
            factor_b *= self.fraction
            factor_b += 1
            mean_b *= self.fraction
            mean_b += mean
            var_b *= self.fraction
            var_b += var * (m / (m - 1) if m > 1 else 1.0)
        self.inv_std = 1.0 / xp.sqrt(var + self.eps)
        y *= self.inv_std[:, None]
        if not self.use_global:
            xp.copyto(self.x_norm, y)

    def backward(self, tops, propagate_down, bottoms):
        if not propagate_down[0]:
            return
        xp, inv_std = self.xp, self.inv_std[:, None]
        gy, gx = tops[0].diff.reshape(self.view), bottoms[0].diff.reshape(self.view)
        if self.use_global:
            xp.multiply(gy, inv_std, out=gx)
            return
        # gx = (gy - mean(gy) - mean(gy * x_norm) * x_norm) / std, means over all but channels
        m = gy.size // self.C
        mean_gy = gy.mean(axis=(0, 2))[:, None]
        mean_gyx = (xp.einsum("ncs,ncs->c", gy, self.x_norm) / m)[:, None]
        xp.subtract(gy, mean_gy, out=gx)
        gx -= self.x_norm * mean_gyx
        gx *= inv_std


def _scale_reads_in_backward(layer, k: int, bottom_need) -> bool:
    if k == 0:  # x, when the scale takes a gradient: a learned scale, or a scale bottom
        # that needs one (a cont mask needs none, so its x is not kept for backward)
        return len(bottom_need) == 1 or bool(bottom_need[1])
    return bool(bottom_need[0])  # the scale bottom, for x's gradient


@register_layer("Scale")
class ScaleLayer(Layer):
    """y = x * s + b; s, b of shape x.shape[axis:axis+k]; s learned or bottom[1] (cont masks)."""

    num_bottoms = (1, 2)
    in_place = True
    param_blobs = ("scale (x.shape[axis:axis + num_axes]), with one bottom",
                   "bias (the scale's shape), with bias_term")
    # backward reads x for the scale's gradient, but never an overwritten x: in place, forward
    # keeps a copy of x; out of place it reads the bottom (see _scale_reads_in_backward)
    backward_reads = ()
    memory = MemoryTraits(reads_in_backward=_scale_reads_in_backward)

    def layer_setup(self, bottoms, tops):
        p = self.param.scale_param
        self.axis, self.scale_shape = operand_shape(self, bottoms, p, "scale")
        if len(bottoms) == 1:
            filler = p.filler if p.HasField("filler") else FillerParameter(type="constant", value=1)
            self.param_blob(self.scale_shape, filler)
        self.bias_term = p.bias_term
        if self.bias_term:
            self.param_blob(self.scale_shape, p.bias_filler)
        self.x_copy = None

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        if len(bottoms) == 2:
            # the scale bottom (e.g. cont, (T, N)) may change with the batch: re-read it
            want = bottoms[1].shape
            found = shape[self.axis : self.axis + len(want)]
            if found != want:
                raise self.error(
                    f"scale bottom '{bottoms[1].name}' of shape {want} must equal the shape "
                    f"{found} of bottom '{bottoms[0].name}' {shape} from axis {self.axis}"
                )
            self.scale_shape = want
        self.view = operand_view(self, bottoms, self.axis, self.scale_shape, "scale")
        tops[0].reshape(shape)

    def _scale(self, bottoms):
        return (bottoms[1] if len(bottoms) == 2 else self.blobs[0]).data.reshape(1, -1, 1)

    def forward(self, bottoms, tops):
        xp, x = self.xp, bottoms[0].data
        y = tops[0].data
        if xp.may_share_memory(x, y):
            if self.x_copy is None or self.x_copy.shape != x.shape:
                self.x_copy = xp.empty_like(x)
            xp.copyto(self.x_copy, x)
        else:
            self.x_copy = None
        y3 = y.reshape(self.view)
        xp.multiply(x.reshape(self.view), self._scale(bottoms), out=y3)
        if self.bias_term:
            y3 += self.blobs[-1].data.reshape(1, -1, 1)

    def backward(self, tops, propagate_down, bottoms):
        xp = self.xp
        gy = tops[0].diff.reshape(self.view)
        # scale and bias gradients first: in place, writing gx overwrites gy
        if self.bias_term:
            self.blobs[-1].diff += gy.sum(axis=(0, 2)).reshape(self.scale_shape)
        two = len(bottoms) == 2
        if not two or propagate_down[1]:
            x = (self.x_copy if self.x_copy is not None else bottoms[0].data).reshape(self.view)
            gs = xp.einsum("osi,osi->s", gy, x).reshape(self.scale_shape)
            if two:
                bottoms[1].diff[...] = gs
            else:
                self.blobs[0].diff += gs
        if propagate_down[0]:
            xp.multiply(gy, self._scale(bottoms), out=bottoms[0].diff.reshape(self.view))
