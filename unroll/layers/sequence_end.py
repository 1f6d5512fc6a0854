"""Each column's state after its own sequence's last step, found from ``cont``.

The unroller ends a ``recurrent(..., sequence_output=False)`` layer with one of
these. Bottoms, in the order the recurrence runs (time order, or reversed for
the reverse direction): the T per-step states, each (1, N, ...), then the T - 1
cont blobs, each (1, N), of run steps 1 .. T-1 (1 where a step continues the
previous one). Each column must hold ONE sequence:

- ``LeadingSequenceEnd``: the sequence starts the run and padding follows
  (cont 1 ... 1 0 ... 0 after step 0); the top is the state at its last step.
- ``TrailingSequenceEnd``: padding, then the sequence ends the run (cont
  0 ... 0 1 ... 1); the top is the state at the last run step.

Any other cont (a sequence that restarts, padding on the wrong side) is an
error: a padded column would otherwise give a state that ignores its sequence.
"""

from __future__ import annotations

import numpy as np

from unroll.backend import to_numpy
from unroll.layer import Layer, register_layer


class _SequenceEnd(Layer):
    num_bottoms = (1, None)
    backward_reads = ()
    #: where each column's sequence sits in the run: "leading" or "trailing"
    side = ""

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index < self.steps

    def setup(self, bottoms, tops):
        if len(bottoms) % 2 != 1:
            raise self.error(
                f"takes T states then T - 1 conts (an odd number of bottoms), found {len(bottoms)}"
            )
        self.steps = (len(bottoms) + 1) // 2

    def reshape(self, bottoms, tops):
        states, conts = bottoms[: self.steps], bottoms[self.steps :]
        shape = states[0].shape
        if len(shape) < 2 or shape[0] != 1:
            raise self.error(f"states must be (1, N, ...), found '{states[0].name}' {shape}")
        for b in states[1:]:
            if b.shape != shape:
                raise self.error(f"state '{b.name}' {b.shape} differs from '{states[0].name}' "
                                 f"{shape}")
        for c in conts:
            if c.shape != shape[:2]:
                raise self.error(f"cont '{c.name}' {c.shape} must be (1, N) = {shape[:2]}")
        tops[0].reshape(shape)

    def _last_steps(self, conts, n: int) -> np.ndarray:
        """The run step holding each of the ``n`` columns' last state, after checking them."""
        if not conts:
            return np.zeros(n, np.int64)
        c = np.concatenate([to_numpy(b.data).reshape(1, -1) for b in conts])  # (T - 1, N)
        if not np.isin(c, (0, 1)).all():
            raise self.error(f"cont must be 0 or 1, found {sorted(set(c[~np.isin(c, (0, 1))]))}")
        step = np.diff(c, axis=0)
        bad = (step > 0) if self.side == "leading" else (step < 0)
        if bad.any():
            col = int(np.flatnonzero(bad.any(axis=0))[0])
            pattern = " ".join(str(int(v)) for v in c[:, col])
            want = ("the sequence first, then padding (cont 1 ... 1 0 ... 0)"
                    if self.side == "leading" else
                    "padding first, then the sequence (cont 0 ... 0 1 ... 1)")
            raise self.error(
                f"column {col} does not hold one sequence padded as this layer reads it: "
                f"cont over run steps 1..{len(conts)} is [{pattern}], expected {want}. "
                f"Pad every batch as the recurrent layer's align= says (time_major(..., "
                f"align=...)), one sequence per column"
            )
        if self.side == "leading":
            return c.sum(axis=0).astype(np.int64)
        return np.full(c.shape[1], len(conts), np.int64)

    def forward(self, bottoms, tops):
        states = bottoms[: self.steps]
        self.picked = self._last_steps(bottoms[self.steps :], states[0].shape[1])
        y = tops[0].data
        for k in np.unique(self.picked).tolist():
            cols = self.xp.asarray(np.flatnonzero(self.picked == k))
            y[:, cols] = states[k].data[:, cols]

    def backward(self, tops, propagate_down, bottoms):
        gy = tops[0].diff
        for k, b in enumerate(bottoms[: self.steps]):
            if propagate_down[k]:
                b.diff[...] = 0
                cols = np.flatnonzero(self.picked == k)
                if cols.size:
                    cols = self.xp.asarray(cols)
                    b.diff[:, cols] = gy[:, cols]


@register_layer("LeadingSequenceEnd")
class LeadingSequenceEndLayer(_SequenceEnd):
    """The state at each column's last sequence step; the sequence starts the run."""

    side = "leading"


@register_layer("TrailingSequenceEnd")
class TrailingSequenceEndLayer(_SequenceEnd):
    """The state at the last run step, checked to end each column's sequence."""

    side = "trailing"
