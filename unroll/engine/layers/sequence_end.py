"""Each column's state after its own sequence's last step, found from ``cont``.

The unroller ends a ``recurrent(..., sequence_output=False)`` layer with one of
these. Bottoms are in the order the recurrence runs (time order, or reversed
for the reverse direction): states, each (1, N, ...), then the T - 1 cont
blobs, each (1, N), of run steps 1 .. T-1 (1 where a step continues the
previous one). Each column must hold ONE sequence:

- ``LeadingSequenceEnd`` (bottoms: the T states, then the conts): the sequence
  starts the run and padding follows (cont 1 ... 1 0 ... 0 after step 0); the
  top is the state at its last step.
- ``TrailingSequenceEnd`` (bottoms: the last run step's state, then the
  conts): padding, then the sequence, which ends the run (cont 0 ... 0 1 ... 1);
  the top is that state.

Any other cont (a sequence that restarts, padding on the wrong side) is an
error: a padded column would otherwise give a state that ignores its sequence.
Reading cont costs one device-to-host copy per forward.
"""

from __future__ import annotations

import numpy as np

from unroll.engine.backend import to_numpy
from unroll.engine.layer import Layer, register_layer


class _SequenceEnd(Layer):
    num_bottoms = (1, None)
    backward_reads = ()
    #: where each column's sequence sits in the run: "leading" or "trailing"
    side = ""

    def _n_states(self, n_bottoms: int) -> int:
        raise NotImplementedError

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index < self.n_states

    def reshape(self, bottoms, tops):
        self.n_states = self._n_states(len(bottoms))
        states, conts = bottoms[: self.n_states], bottoms[self.n_states :]
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
        self.mask_shape = shape[:2] + (1,) * (len(shape) - 2)
        tops[0].reshape(shape)

    def _checked_conts(self, conts) -> np.ndarray:
        """The conts of run steps 1..T-1 as one (T - 1, N) host array, checked column by column."""
        c = to_numpy(self.xp.concatenate([b.data for b in conts]))  # one copy to the host
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
        return c


@register_layer("LeadingSequenceEnd")
class LeadingSequenceEndLayer(_SequenceEnd):
    """The state at each column's last sequence step; the sequence starts the run."""

    side = "leading"

    def _n_states(self, n_bottoms: int) -> int:
        if n_bottoms % 2 != 1:
            raise self.error(
                f"takes T states then T - 1 conts (an odd number of bottoms), found {n_bottoms}"
            )
        return (n_bottoms + 1) // 2

    def forward(self, bottoms, tops):
        states, conts = bottoms[: self.n_states], bottoms[self.n_states :]
        picked = (self._checked_conts(conts).sum(axis=0) if conts
                  else np.zeros(states[0].shape[1])).astype(np.int64)
        self.picked = self.xp.asarray(picked).reshape(self.mask_shape)
        for k in np.unique(picked).tolist():
            self.xp.copyto(tops[0].data, states[k].data, where=self.picked == k)

    def backward(self, tops, propagate_down, bottoms):
        gy = tops[0].diff
        for k, b in enumerate(bottoms[: self.n_states]):
            if propagate_down[k]:
                self.xp.multiply(gy, self.picked == k, out=b.diff)


@register_layer("TrailingSequenceEnd")
class TrailingSequenceEndLayer(_SequenceEnd):
    """The last run step's state, checked to end each column's sequence."""

    side = "trailing"

    def _n_states(self, n_bottoms: int) -> int:
        return 1

    def forward(self, bottoms, tops):
        if len(bottoms) > 1:
            self._checked_conts(bottoms[1:])
        self.xp.copyto(tops[0].data, bottoms[0].data)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            self.xp.copyto(bottoms[0].diff, tops[0].diff)
