"""Concat, Slice and Split: join, cut and fan out blobs without arithmetic.

These are the hot glue of an unrolled net: a Slice with T tops cuts a (T, N, D)
sequence into T steps, a Concat joins T steps back, and the net inserts a Split
wherever one blob feeds several layers. Each copies whole blocks with one array
operation per blob (index tuples are computed once, in ``reshape``).
"""

from __future__ import annotations

from unroll.engine.layer import Layer, register_layer
from unroll.engine.memory_traits import MemoryTraits
from unroll.graph.rules import SplitSpec


def _axis(layer, message, legacy: str, ndim: int) -> int:
    """The axis of a concat/slice param: ``axis`` or the legacy ``<legacy>`` (not both)."""
    if message.HasField(legacy):
        if message.HasField("axis"):
            raise layer.error(f"set either axis or {legacy}, not both")
        dim = getattr(message, legacy)
        if dim >= ndim:
            raise layer.error(f"{legacy} {dim} out of range for a {ndim}-D bottom")
        return dim
    return layer.canonical_axis(message.axis, ndim)


def _cuts(axis: int, bounds) -> list:
    """Index tuples selecting ``[a, b)`` along ``axis`` for consecutive bounds."""
    lead = (slice(None),) * axis
    return [lead + (slice(a, b),) for a, b in zip(bounds[:-1], bounds[1:])]


@register_layer("Concat")
class ConcatLayer(Layer):
    """y = concatenate(x_1..x_K, axis); bottoms agree on every other axis."""

    num_bottoms = (1, None)
    backward_reads = ()
    #: the bottoms are consecutive parts of the top: a net may place them inside it
    memory = MemoryTraits(parts_of_whole="bottoms")

    def reshape(self, bottoms, tops):
        first = bottoms[0].shape
        if not first:
            raise self.error("cannot concatenate 0-D bottoms")
        axis = _axis(self, self.param.concat_param, "concat_dim", len(first))
        bounds = [0]
        for i, b in enumerate(bottoms):
            if b.ndim != len(first) or b.shape[:axis] + b.shape[axis + 1:] != (
                first[:axis] + first[axis + 1:]
            ):
                raise self.error(
                    f"bottom {i} '{b.name}' has shape {b.shape}, incompatible with bottom 0 "
                    f"'{bottoms[0].name}' {first} for concatenation along axis {axis}"
                )
            bounds.append(bounds[-1] + b.shape[axis])
        self.axis = axis
        self.cuts = _cuts(axis, bounds)
        self.parts_in_whole = ([False] * len(bottoms), [False] * len(bottoms))
        tops[0].reshape(first[:axis] + (bounds[-1],) + first[axis + 1:])

    def forward(self, bottoms, tops):
        placed = self.parts_in_whole[0]
        if not any(placed):
            self.xp.concatenate([b.data for b in bottoms], axis=self.axis, out=tops[0].data)
            return
        y = tops[0].data
        for b, cut, inside in zip(bottoms, self.cuts, placed):
            if not inside:  # a part placed inside the top is there already
                y[cut] = b.data

    def backward(self, tops, propagate_down, bottoms):
        gy = tops[0].diff
        for down, b, cut, inside in zip(propagate_down, bottoms, self.cuts,
                                        self.parts_in_whole[1]):
            if down and not inside:
                b.diff[...] = gy[cut]


@register_layer("Slice")
class SliceLayer(Layer):
    """y_k = x[..., p_k:p_{k+1}, ...] along axis, at slice_point (or K equal parts)."""

    num_tops = (1, None)
    backward_reads = ()
    #: the tops are consecutive parts of the bottom: a net may place them inside it
    memory = MemoryTraits(parts_of_whole="tops")

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        if not shape:
            raise self.error("cannot slice a 0-D bottom")
        p = self.param.slice_param
        axis = _axis(self, p, "slice_dim", len(shape))
        size, k = shape[axis], len(tops)
        points = list(p.slice_point)
        if points:
            if len(points) != k - 1:
                raise self.error(f"{len(points)} slice_point(s) for {k} tops; need {k - 1}")
            bounds = [0, *points, size]
            if any(a >= b for a, b in zip(bounds[:-1], bounds[1:])):
                raise self.error(
                    f"slice_point {points} must increase strictly inside (0, {size}) "
                    f"(axis {axis} of bottom shape {shape})"
                )
        else:
            if size % k:
                raise self.error(
                    f"cannot cut axis {axis} of size {size} (bottom shape {shape}) into "
                    f"{k} equal parts; give slice_point"
                )
            bounds = list(range(0, size + 1, size // k)) if size else [0] * (k + 1)
        self.axis = axis
        self.cuts = _cuts(axis, bounds)
        self.parts_in_whole = ([False] * len(tops), [False] * len(tops))
        for top, a, b in zip(tops, bounds[:-1], bounds[1:]):
            top.reshape(shape[:axis] + (b - a,) + shape[axis + 1:])

    def forward(self, bottoms, tops):
        x = bottoms[0].data
        for top, cut, inside in zip(tops, self.cuts, self.parts_in_whole[0]):
            if not inside:  # a part placed inside the bottom is there already
                top.data[...] = x[cut]

    def backward(self, tops, propagate_down, bottoms):
        if not propagate_down[0]:
            return
        placed = self.parts_in_whole[1]
        if not any(placed):
            self.xp.concatenate([t.diff for t in tops], axis=self.axis, out=bottoms[0].diff)
            return
        gx = bottoms[0].diff
        for top, cut, inside in zip(tops, self.cuts, placed):
            if not inside:
                gx[cut] = top.diff


@register_layer("Split")
class SplitLayer(Layer):
    """y_k = x for every top (data shared, diffs separate); gx = sum_k gy_k."""

    num_tops = (1, None)
    same_shape = True
    backward_reads = ()
    #: the tops' data arrays ARE the bottom's (no copy); a write to one shows in all
    memory = MemoryTraits(shares_bottom=("data",))

    @property
    def param(self):
        """The LayerParameter; for a split a net inserted (a
        :class:`~unroll.graph.rules.SplitSpec`), made when asked for, so the net holds no
        message per split."""
        spec = self._spec
        return spec.layer_parameter() if isinstance(spec, SplitSpec) else spec

    @param.setter
    def param(self, param) -> None:
        self._spec = param

    def compact(self) -> None:
        """A split's description is small already (a SplitSpec or the prototxt's own)."""

    def reshape(self, bottoms, tops):
        for top in tops:
            top.reshape(bottoms[0].shape)
            top.share_data(bottoms[0])  # follows the bottom's memory wherever it is placed

    def forward(self, bottoms, tops):
        pass

    def backward(self, tops, propagate_down, bottoms):
        if not propagate_down[0]:
            return
        gx = bottoms[0].diff
        if len(tops) == 1:
            gx[...] = tops[0].diff
            return
        self.xp.add(tops[0].diff, tops[1].diff, out=gx)
        for top in tops[2:]:
            gx += top.diff
