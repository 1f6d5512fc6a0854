"""Softmax, the losses (SoftmaxWithLoss, EuclideanLoss) and Accuracy.

Scores are laid out as in Caffe: along ``axis`` lie the C classes, the axes
before it multiply to ``outer`` and those after it to ``inner``; the label
blob holds ``outer * inner`` class indices (as floats; one that is not a whole number
is an error, where Caffe would truncate it). A loss or accuracy top is a 0-D scalar, ``()``,
as Caffe's own (a blob of 0 axes). A loss layer's top diff holds its loss
weight, which scales the gradient.
"""

from __future__ import annotations

import math

import numpy as np

from unroll.core.proto import NormalizationMode as Norm
from unroll.engine.layer import Layer, register_layer
from unroll.engine.memory.weight_gradients import time_chunks


class ClassScores(Layer):
    """Bottoms: scores with classes along ``axis`` and labels with outer * inner entries."""

    num_bottoms = (2, 2)
    backward_reads = ()

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def split_axes(self, bottoms, axis):
        """Set ``self.dims = (outer, C, inner)`` and check the label count."""
        shape, labels = bottoms[0].shape, bottoms[1]
        if not shape:
            raise self.error(f"scores '{bottoms[0].name}' must have at least 1 axis, found 0-D")
        axis = self.canonical_axis(axis, len(shape))
        self.dims = (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))
        outer, classes, inner = self.dims
        if labels.count != outer * inner:
            raise self.error(
                f"labels '{labels.name}' {labels.shape} have {labels.count} entries; scores "
                f"'{bottoms[0].name}' {shape} with classes on axis {axis} need "
                f"{outer} * {inner} = {outer * inner}"
            )

    checks_host_bottoms = True

    def check_host_bottom(self, index: int, values: np.ndarray, name: str) -> None:
        """Raise a NetError unless host ``values`` of labels ``name`` are valid class indices.

        Labels are checked here, on the host, where they enter the net (``Net.set_input``);
        forward checks them again only on the CPU, where that costs no wait for a device.
        """
        if index != 1:
            return
        classes = self.dims[1]
        # Caffe's static_cast<int> would quietly read 1.5 as class 1: a label that is not
        # a whole number is a bug in the data, not a class
        with np.errstate(invalid="ignore"):
            label = values.astype(np.int64)
        fractional = label != values
        if fractional.any():
            raise self.error(f"label {float(values[fractional][0]):g} in '{name}' is not a whole "
                             f"number; labels are class indices")
        valid = label != self.ignore if self.ignore is not None else True
        bad = valid & ((label < 0) | (label >= classes))
        if bad.any():
            hint = f" (ignore_label is {self.ignore})" if self.ignore is not None else ""
            raise self.error(
                f"label {float(values[bad][0]):g} in '{name}' is out of range [0, {classes}) "
                f"for {classes} classes{hint}"
            )

    def labels(self, bottoms):
        """(class index with ignored entries set to 0, valid mask), both (outer, inner)."""
        xp, (outer, _, inner) = self.xp, self.dims
        value = bottoms[1].data.reshape(outer, inner)
        if xp is np:
            self.check_host_bottom(1, value, bottoms[1].name)
        label = value.astype(xp.int32)
        valid = label != self.ignore if self.ignore is not None else xp.ones(label.shape, bool)
        return xp.where(valid, label, 0), valid


@register_layer("Softmax")
class SoftmaxLayer(Layer):
    """y = exp(x) / sum(exp(x), axis); any shape."""

    backward_reads = ("top",)
    same_shape = True

    def reshape(self, bottoms, tops):
        self.axis = self.canonical_axis(self.param.softmax_param.axis, bottoms[0].ndim)
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        x, y = bottoms[0].data, tops[0].data
        self.xp.subtract(x, x.max(axis=self.axis, keepdims=True), out=y)
        self.xp.exp(y, out=y)
        y /= y.sum(axis=self.axis, keepdims=True)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            y, gy, gx = tops[0].data, tops[0].diff, bottoms[0].diff
            self.xp.multiply(gy, y, out=gx)
            self.xp.subtract(gy, gx.sum(axis=self.axis, keepdims=True), out=gx)
            gx *= y


@register_layer("SoftmaxWithLoss")
class SoftmaxWithLossLayer(ClassScores):
    """loss = -sum_valid log softmax(x)[label] / normalizer; top 1 (optional): the softmax."""

    num_tops = (1, 2)
    is_loss = True
    param_messages = ("loss_param", "softmax_param")

    def layer_setup(self, bottoms, tops):
        p = self.param.loss_param
        self.ignore = p.ignore_label if p.HasField("ignore_label") else None
        self.mode = p.normalization
        if not p.HasField("normalization") and p.HasField("normalize"):
            self.mode = Norm.VALID if p.normalize else Norm.BATCH_SIZE

    def reshape(self, bottoms, tops):
        self.split_axes(bottoms, self.param.softmax_param.axis)
        tops[0].reshape(())
        if len(tops) > 1:
            tops[1].reshape(bottoms[0].shape)
        self.reserve("prob", self.dims)

    def normalizer(self, valid, outer: int):
        """What the losses are divided by, for ``valid`` labels and ``outer`` (the whole
        output's: a chunk of it is divided as the whole is)."""
        inner = self.dims[2]
        if self.mode == Norm.VALID and self.ignore is not None:
            return self.xp.maximum(valid.sum(), 1)  # all ignored: loss 0, not NaN (Caffe)
        return max(1, {Norm.FULL: outer * inner, Norm.VALID: outer * inner,
                       Norm.BATCH_SIZE: outer, Norm.NONE: 1}[self.mode])

    def position_losses(self, bottoms, normalizer):
        """The loss of every position, (outer * inner,): -log softmax(x)[label] times its
        weight (valid / ``normalizer``); the softmax stays in the scratch "prob"."""
        xp, p = self.xp, self.scratch("prob")
        self.label, valid = self.labels(bottoms)
        x = bottoms[0].data.reshape(self.dims)
        xp.subtract(x, x.max(axis=1, keepdims=True), out=p)
        # log p[label] = shifted x[label] - log(total): no log(0) when p[label] underflows
        picked = xp.take_along_axis(p, self.label[:, None], 1)[:, 0]
        xp.exp(p, out=p)
        total = p.sum(axis=1)
        p /= total[:, None]
        log_p = picked - xp.log(total)
        self.weight = valid.astype(self.dtype)
        self.weight /= normalizer(valid)
        return (-(log_p * self.weight)).reshape(-1)

    def forward(self, bottoms, tops):
        # one sum over every position, as a loss run by chunks sums the chunks' positions
        # (docs/design.md, 6. Memory, the whole-output loss)
        tops[0].data[...] = self.position_losses(
            bottoms, lambda valid: self.normalizer(valid, self.dims[0])).sum()
        if len(tops) > 1:
            tops[1].data[...] = self.scratch("prob").reshape(tops[1].shape)

    def scores_diff(self, bottoms, loss_diff):
        """bottoms[0].diff: (softmax - onehot) * weight * ``loss_diff`` (a position's)."""
        onehot = self.xp.arange(self.dims[1])[:, None] == self.label[:, None]
        scale = (self.weight * loss_diff)[:, None]
        gx = (self.scratch("prob") - onehot) * scale
        bottoms[0].diff[...] = gx.reshape(bottoms[0].shape)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            self.scores_diff(bottoms, tops[0].diff)


@register_layer("EuclideanLoss")
class EuclideanLossLayer(Layer):
    """loss = sum((a - b)^2) / (2 N), N = a.shape[0]; a and b of one count.

    The sum is by chunks of :data:`~unroll.engine.memory.GRADIENT_CHUNK` along axis 0
    (each chunk's share divided by 2 N, the shares summed), as a loss run by chunks of
    time sums it (docs/design.md, 6. Memory, the whole-output loss).
    """

    num_bottoms = (2, 2)
    backward_reads = ()
    is_loss = True

    def reshape(self, bottoms, tops):
        a, b = bottoms[:2]
        if a.count != b.count or a.ndim < 1 or b.ndim < 1 or a.shape[0] != b.shape[0]:
            raise self.error(f"bottoms '{a.name}' {a.shape} and '{b.name}' {b.shape} must "
                             f"have the same count and first dimension")
        tops[0].reshape(())
        self.reserve("diff", a.shape)

    def share(self, d, steps: int):
        """The loss of differences ``d``, a chunk of an output of ``steps`` along axis 0."""
        return self.xp.vdot(d, d) / (2 * steps)

    def forward(self, bottoms, tops):
        a, b = bottoms
        d = self.scratch("diff")
        self.xp.subtract(a.data, b.data.reshape(a.shape), out=d)
        shares = [self.share(d[rows.start:rows.stop], a.shape[0])
                  for rows in reversed(time_chunks(a.shape[0]))]
        # one chunk's share is the sum itself: no stack and sum to launch on a device
        tops[0].data[...] = shares[0] if len(shares) == 1 else self.xp.stack(shares).sum()

    def backward(self, tops, propagate_down, bottoms):
        if any(propagate_down):
            self.pass_diffs(bottoms, propagate_down, tops[0].diff / bottoms[0].shape[0])

    def pass_diffs(self, bottoms, propagate_down, scale):
        """a.diff = d * ``scale``, b.diff = -d * ``scale``, as asked."""
        a, b = bottoms[:2]
        d = self.scratch("diff")
        if propagate_down[0]:
            self.xp.multiply(d, scale, out=a.diff)
        if propagate_down[1]:
            b.diff[...] = (d * -scale).reshape(b.shape)


@register_layer("Accuracy")
class AccuracyLayer(ClassScores):
    """y = fraction of valid labels among the top_k scores (ties count against); () and (C,)."""

    num_tops = (1, 2)

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottoms, tops):
        p = self.param.accuracy_param
        self.top_k = p.top_k
        self.ignore = p.ignore_label if p.HasField("ignore_label") else None

    def reshape(self, bottoms, tops):
        self.split_axes(bottoms, self.param.accuracy_param.axis)
        classes = self.dims[1]
        if not 1 <= self.top_k <= classes:
            raise self.error(f"top_k {self.top_k} must be in [1, {classes}] "
                             f"(classes of '{bottoms[0].name}' {bottoms[0].shape})")
        tops[0].reshape(())
        if len(tops) > 1:
            tops[1].reshape((classes,))

    def forward(self, bottoms, tops):
        xp, classes = self.xp, self.dims[1]
        label, valid = self.labels(bottoms)
        x = bottoms[0].data.reshape(self.dims)
        true = xp.take_along_axis(x, label[:, None], 1)
        hit = valid & ((x >= true).sum(axis=1) <= self.top_k)
        tops[0].data[...] = hit.sum() / xp.maximum(valid.sum(), 1)
        if len(tops) > 1:
            seen = xp.bincount(label[valid], minlength=classes)
            right = xp.bincount(label[hit], minlength=classes)
            tops[1].data[...] = right / xp.maximum(seen, 1)

    def backward(self, tops, propagate_down, bottoms):
        for down, bottom in zip(propagate_down, bottoms):  # no gradient: zero, if asked
            if down:
                bottom.diff[...] = 0
