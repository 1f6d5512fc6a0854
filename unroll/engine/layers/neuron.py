"""Element-wise layers: ReLU, Sigmoid, TanH, Dropout, Threshold (all may run in place), Power
and AbsVal."""

from __future__ import annotations

from unroll.engine.layer import Layer, register_layer


class NeuronLayer(Layer):
    """One bottom, one top of the same shape; may run in place."""

    in_place = True
    same_shape = True

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)


@register_layer("ReLU")
class ReLULayer(NeuronLayer):
    """y = max(x, 0) + negative_slope * min(x, 0); any shape."""

    # y > 0 exactly where x > 0, so backward can read the (possibly in-place) top
    backward_reads = ("top",)

    def layer_setup(self, bottoms, tops):
        self.slope = self.param.relu_param.negative_slope
        if self.slope < 0:
            raise self.error(f"negative_slope must be >= 0 for in-place safety, found {self.slope}")

    def forward(self, bottoms, tops):
        x = bottoms[0].data
        if self.slope:
            scale = self.xp.where(x > 0, 1, self.slope).astype(x.dtype)
            self.xp.multiply(x, scale, out=tops[0].data)
        else:
            self.xp.maximum(x, 0, out=tops[0].data)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            positive = tops[0].data > 0
            scale = self.xp.where(positive, 1, self.slope).astype(tops[0].diff.dtype)
            self.xp.multiply(tops[0].diff, scale, out=bottoms[0].diff)


@register_layer("Sigmoid")
class SigmoidLayer(NeuronLayer):
    """y = 1 / (1 + exp(-x)); any shape."""

    backward_reads = ("top",)

    def forward(self, bottoms, tops):
        xp = self.xp
        # 0.5 * tanh(0.5 x) + 0.5 is the overflow-free form of the logistic
        y = tops[0].data
        xp.multiply(bottoms[0].data, 0.5, out=y)
        xp.tanh(y, out=y)
        y *= 0.5
        y += 0.5

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            y = tops[0].data
            bottoms[0].diff[...] = tops[0].diff * y * (1 - y)


@register_layer("TanH")
class TanHLayer(NeuronLayer):
    """y = tanh(x); any shape."""

    backward_reads = ("top",)

    def forward(self, bottoms, tops):
        self.xp.tanh(bottoms[0].data, out=tops[0].data)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            y = tops[0].data
            bottoms[0].diff[...] = tops[0].diff * (1 - y * y)


@register_layer("Dropout")
class DropoutLayer(NeuronLayer):
    """Train: y = x * mask / (1 - ratio), mask ~ Bernoulli(1 - ratio); test: y = x."""

    backward_reads = ()
    #: draws from the net's generator: never run on a thread beside another layer
    draws_random = True

    def layer_setup(self, bottoms, tops):
        self.ratio = self.param.dropout_param.dropout_ratio
        if not 0 <= self.ratio < 1:
            raise self.error(f"dropout_ratio must be in [0, 1), found {self.ratio}")
        self.masked = self.phase == "train" and self.ratio > 0

    def reshape(self, bottoms, tops):
        super().reshape(bottoms, tops)
        if self.masked:
            self.reserve("mask", bottoms[0].shape)

    def forward(self, bottoms, tops):
        x = bottoms[0].data
        if not self.masked:
            if tops[0].data is not x:
                tops[0].data[...] = x
            return
        mask = self.scratch("mask")
        self.xp.greater_equal(self.rng.random(x.shape, dtype=x.dtype), self.ratio, out=mask)
        mask *= 1.0 / (1.0 - self.ratio)
        self.xp.multiply(x, mask, out=tops[0].data)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            if not self.masked:
                if bottoms[0].diff is not tops[0].diff:
                    bottoms[0].diff[...] = tops[0].diff
            else:
                self.xp.multiply(tops[0].diff, self.scratch("mask"), out=bottoms[0].diff)


@register_layer("Power")
class PowerLayer(Layer):
    """y = (shift + scale * x) ^ power; any shape (1 - cont is Power with scale -1, shift 1)."""

    same_shape = True

    def layer_setup(self, bottoms, tops):
        p = self.param.power_param
        self.power, self.scale, self.shift = p.power, p.scale, p.shift

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        y = tops[0].data
        self.xp.multiply(bottoms[0].data, self.scale, out=y)
        y += self.shift
        if self.power != 1:
            self.xp.power(y, self.power, out=y)

    def backward(self, tops, propagate_down, bottoms):
        if not propagate_down[0]:
            return
        gx = bottoms[0].diff
        if self.power == 1 or self.scale == 0:
            self.xp.multiply(tops[0].diff, self.scale if self.power else 0.0, out=gx)
            return
        base = self.shift + self.scale * bottoms[0].data
        gx[...] = tops[0].diff * (self.power * self.scale) * base ** (self.power - 1)


@register_layer("AbsVal")
class AbsValLayer(Layer):
    """y = |x|; any shape. gx = sign(x) gy (0 at 0, as Caffe's)."""

    same_shape = True

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        self.xp.abs(bottoms[0].data, out=tops[0].data)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            self.xp.multiply(self.xp.sign(bottoms[0].data), tops[0].diff, out=bottoms[0].diff)


@register_layer("Threshold")
class ThresholdLayer(NeuronLayer):
    """y = 1 where x > 0, else 0; any shape (Caffe's Threshold at its default threshold 0).

    A step has no gradient to pass on (Caffe's backward refuses to run), so no
    bottom takes a forced one; where asked, backward writes the zero it is
    almost everywhere.
    """

    backward_reads = ()

    def allow_force_backward(self, bottom_index):
        return False

    def forward(self, bottoms, tops):
        x, y = bottoms[0].data, tops[0].data
        self.xp.copyto(y, x > 0)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            bottoms[0].diff[...] = 0
