"""One update over the flat buffers: Caffe's Normalize, Regularize, ComputeUpdateValue, Update.

The params, diffs and history live packed in flat buffers (the
:class:`~unroll.engine.param_store.ParamStore`'s and one per history slot), so
an update goes over *spans*: runs of params adjacent in the buffers that one
pass of array operations updates. Where the params of a span differ in
``lr_mult`` or ``decay_mult`` those become arrays with one value per element,
with the same arithmetic as one param at a time, so the same bits
(docs/design.md, Solver). A param with ``lr_mult: 0`` is in no span: it and its
history are left alone, as in Caffe.

>>> import numpy as np
>>> from unroll.core.proto import SolverParameter
>>> from unroll.train.update_rules import SOLVERS
>>> data, diff, h = np.ones(3), np.full(3, 2.0), np.zeros(3)
>>> span = Span(0, 3, (3,), lr_mult=np.float64(1), decay_mult=None)
>>> apply_update(SOLVERS["SGD"], SolverParameter(momentum=0.5), [span], data, diff, [h],
...              rate=0.25, step=0, passes=2)
>>> data, h
(array([0.75, 0.75, 0.75]), array([0.25, 0.25, 0.25]))
"""

from __future__ import annotations

import dataclasses

from unroll.core.proto import SolverParameter
from unroll.engine.backend import module_of
from unroll.train.update_rules import UpdateRule

__all__ = ["Span", "SpanCache", "apply_update", "spans_of"]


@dataclasses.dataclass(frozen=True)
class Span:
    """Params adjacent in the flat buffers that one pass of array operations updates.

    ``lr_mult`` and ``decay_mult`` are scalars of the buffers' dtype, or arrays
    with one value per element where the params differ; ``decay_mult`` is None
    when no param of the span decays (Caffe skips those, so they stay apart).
    """

    start: int
    stop: int
    shape: tuple
    lr_mult: object
    decay_mult: object


def spans_of(params, elementwise: bool, weight_decay: float, like) -> list[Span]:
    """The spans over ``params`` that an update visits; params with ``lr_mult`` 0 are left out."""
    dt, xp = like.dtype.type, module_of(like)

    def decays(p) -> bool:
        return bool(dt(weight_decay) * dt(p.decay_mult))

    def per_element(run, attr):
        values = [dt(getattr(p, attr)) for p in run]
        if all(v == values[0] for v in values):
            return values[0]
        return xp.concatenate([xp.full(p.blob.count, v, like.dtype) for p, v in zip(run, values)])

    runs: list[list] = []
    for p in sorted((p for p in params if p.lr_mult != 0), key=lambda p: p.offset):
        last = runs[-1][-1] if runs else None
        if (elementwise and last is not None and last.offset + last.blob.count == p.offset
                and decays(last) == decays(p)):
            runs[-1].append(p)
        else:
            runs.append([p])
    spans = []
    for run in runs:
        start, stop = run[0].offset, run[-1].offset + run[-1].blob.count
        shape = (stop - start,) if elementwise else run[0].blob.shape
        decay = per_element(run, "decay_mult") if decays(run[0]) else None
        spans.append(Span(start, stop, shape, per_element(run, "lr_mult"), decay))
    return spans


class SpanCache:
    """The spans of one solver's params, rebuilt only when a param's place or mults change."""

    def __init__(self, elementwise: bool):
        self.elementwise = elementwise
        self._key: tuple = ()
        self._spans: list[Span] = []

    def get(self, params, weight_decay: float, data) -> list[Span]:
        if data is None:  # a net without params
            return []
        key = (weight_decay, *((p.offset, p.blob.count, p.lr_mult, p.decay_mult) for p in params))
        if key != self._key:
            self._key = key
            self._spans = spans_of(params, self.elementwise, weight_decay, data)
        return self._spans


def apply_update(rule: UpdateRule, param: SolverParameter, spans, data, diff, history_buffers,
                 rate: float, step: int, passes: int) -> None:
    """Caffe's ApplyUpdate after clipping, span by span: ``diff /= passes`` (the gradients
    were summed over that many passes), weight decay (L2 ``decay * data`` or L1 ``decay *
    sign(data)``, into the gradient, or after the rule and times the rate for a
    ``decoupled_decay`` rule), the rule with ``rate * lr_mult``, then ``data -= diff``."""
    for span in spans:
        where = slice(span.start, span.stop)
        d, w = diff[where].reshape(span.shape), data[where].reshape(span.shape)
        dt = d.dtype.type
        if passes != 1:
            d *= dt(1) / dt(passes)
        decay = None
        if span.decay_mult is not None:
            local_decay = dt(param.weight_decay) * span.decay_mult
            decay = local_decay * (w if param.regularization_type == "L2"
                                   else module_of(w).sign(w))
        if decay is not None and not rule.decoupled_decay:
            d += decay
        local_rate = dt(rate) * span.lr_mult
        rule.update(d, [h[where].reshape(span.shape) for h in history_buffers], local_rate,
                    param, step)
        if decay is not None and rule.decoupled_decay:
            d += local_rate * decay
        w -= d
