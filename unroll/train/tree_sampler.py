"""Batches of trees bucketed by height and level widths, as BucketSampler buckets by length.

A tree net depends only on its level widths (``docs/design.md``, "Unrolling
over trees"), so a batch's widths, rounded up to a coarse grid, are its
bucket: every batch of one bucket runs the one net built for it.

>>> from unroll.frontend.tree import Tree
>>> ts = [Tree.from_heads(h) for h in ([0], [0, 1], [2, 0], [0, 1, 2], [0, 1, 1], [2, 0, 2])]
>>> s = TreeBucketSampler(ts, batch_size=2, shuffle=False)
>>> [s.key(b) for b in s.epoch_batches(0)]
[(1,), (2, 2), (4, 2), (1, 1, 1)]
>>> round(s.padding_fraction(0), 3)
0.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from unroll.frontend.tree import DIRECTIONS, Tree, levels_of
from unroll.frontend.tree_unroller import TREE_DIRECTIONS

__all__ = ["TreeBatch", "TreeBucketSampler", "round_width"]


def round_width(width: int, ratio: float = 1.25) -> int:
    """``width`` rounded up to the grid 1, 2, .., 8, then steps of about ``ratio``.

    >>> [round_width(w) for w in (1, 8, 9, 11, 12, 100)]
    [1, 8, 10, 13, 13, 117]
    """
    if width <= 8:
        return int(width)
    # the grid's k-th value is ceil(8 * ratio ** k): the first one that holds width
    k = max(0, math.floor(math.log(width / 8, ratio)) - 1)
    while math.ceil(8 * ratio ** k) < width:
        k += 1
    return int(math.ceil(8 * ratio ** k))


class TreeBatch(list):
    """One batch: its tree indices (a list), and ``key``, the level widths of the net that
    runs it (those that hold its group's batches: :meth:`TreeBucketSampler.epoch_keys`)."""

    key: tuple


class TreeBucketSampler:
    """Batches of tree indices, each from one height, with its widths rounded to a grid.

    Trees of one height (the number of levels of every direction) are sorted by
    size, cut into batches of ``batch_size`` trees, and each batch's level
    widths (of ``direction``: "up", "down" or "bidirectional", both) are
    rounded up with :func:`round_width`: :meth:`key` is the widths an
    unrolled net is built for (:func:`~unroll.frontend.tree_unroller.expand_tree`), so
    all batches of one key share one net. ``group`` consecutive batches of a
    height (by size) share one key, the widths that hold all of them
    (:meth:`epoch_keys`): fewer nets for more padding. With ``shuffle``, each
    epoch shuffles the trees of equal size within a height first (so batches
    mix differently), and the order of the batches, from ``(seed, epoch)``.

    Data-parallel sharding, as :class:`~unroll.train.bucketing.BucketSampler` shards
    (docs/design.md 7): with ``size`` ranks, rank ``rank`` takes every ``size``-th batch
    of the epoch from position ``rank`` on, ``len(self)`` of them on every rank (the last
    ones, fewer than ``size``, left out), so no rank waits for a step the others never
    take. Each batch is a :class:`TreeBatch`, which knows its key.

    :meth:`padding_fraction` is the share of padded slots over an epoch;
    :meth:`keys` the distinct nets an epoch needs.
    """

    def __init__(self, trees: Sequence[Tree], batch_size: int = 32, direction: str = "up",
                 seed: int = 0, shuffle: bool = True, ratio: float = 1.25, group: int = 1,
                 rank: int = 0, size: int = 1):
        if direction not in TREE_DIRECTIONS:
            raise ValueError(f"direction must be one of {TREE_DIRECTIONS}, found {direction!r}")
        if not trees:
            raise ValueError("no trees to batch")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, found {batch_size}")
        self.trees = list(trees)
        self.batch_size, self.direction = int(batch_size), direction
        self.seed, self.shuffle, self.ratio = int(seed), bool(shuffle), float(ratio)
        if group < 1:
            raise ValueError(f"group must be >= 1, found {group}")
        self.group = int(group)
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, size={size}), found {rank}")
        self.rank, self.size = int(rank), int(size)
        self.sizes = np.array([len(t) for t in self.trees])
        self.heights = np.array([int(t.heights().max()) for t in self.trees])
        #: each tree's nodes per level, by direction (heights and depths cost a pass a tree)
        self._counts = {d: [np.bincount(levels_of(t, d)) for t in self.trees] for d in DIRECTIONS}
        self.epoch = 0
        # the keys of the unshuffled batches: a shuffled epoch's batches take these where
        # they hold them, so that later epochs build few nets of their own
        self._profiles: dict = {}
        self._profiles = {h: [k for _, k in plan] for h, plan in self._by_height(None)}

    def epoch_batches(self, epoch: int) -> list[TreeBatch]:
        """This rank's batches of epoch ``epoch`` (lists of tree indices, with their key)."""
        batches = []
        for ids, key in self._plan(int(epoch)):
            batches.append(TreeBatch(ids))
            batches[-1].key = key
        return batches

    def epoch_keys(self, epoch: int) -> list[tuple]:
        """The key of each batch of :meth:`epoch_batches` (``group`` batches share one)."""
        return [key for _, key in self._plan(int(epoch))]

    def _plan(self, epoch: int) -> list[tuple[list[int], tuple]]:
        """This rank's (batch, key) pairs of ``epoch``."""
        rng = np.random.default_rng([self.seed, epoch])
        planned = [p for _, plan in self._by_height(rng if self.shuffle else None) for p in plan]
        if self.shuffle:
            planned = [planned[k] for k in rng.permutation(len(planned)).tolist()]
        return planned[self.rank:len(self) * self.size:self.size]

    def _by_height(self, rng):
        """(height, [(batch, key)]) for each height; trees of equal size shuffled by ``rng``."""
        for height in np.unique(self.heights).tolist():
            ids = np.flatnonzero(self.heights == height)
            if rng is not None:
                ids = rng.permutation(ids)
            ids = ids[np.argsort(self.sizes[ids], kind="stable")]
            batches = [ids[i: i + self.batch_size].tolist()
                       for i in range(0, ids.size, self.batch_size)]
            profiles = self._profiles.get(height)
            plan = []
            for g in range(0, len(batches), self.group):
                chunk = batches[g: g + self.group]
                key = self._held(chunk, profiles[g] if profiles else None)
                plan += [(b, key) for b in chunk]
            yield height, plan

    def _held(self, chunk, profile=None) -> tuple:
        """The widths that hold every batch of ``chunk`` (and ``profile``, a key): the most
        of each level, rounded."""
        keys = [self.key(b) for b in chunk] + ([profile] if profile is not None else [])
        if self.direction == "bidirectional":
            return tuple(tuple(max(k[d][lv] for k in keys) for lv in range(len(keys[0][d])))
                         for d in range(2))
        return tuple(max(k[lv] for k in keys) for lv in range(len(keys[0])))

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter(self.epoch_batches(epoch))

    def __len__(self) -> int:
        """Steps of an epoch: this rank's batches."""
        return sum(math.ceil(int((self.heights == h).sum()) / self.batch_size)
                   for h in np.unique(self.heights).tolist()) // self.size

    def _widths(self, batch, direction: str) -> tuple:
        counts = [self._counts[direction][i] for i in batch]
        total = np.zeros(max(c.size for c in counts), np.int64)
        for c in counts:
            total[: c.size] += c
        return tuple(round_width(int(w), self.ratio) for w in total)

    def key(self, batch: Sequence[int]) -> tuple:
        """The level widths ``batch`` is padded to: a tuple, or (up, down) for bidirectional."""
        if self.direction == "bidirectional":
            return (self._widths(batch, "up"), self._widths(batch, "down"))
        return self._widths(batch, self.direction)

    def keys(self, epoch: int | None = None) -> set:
        """The distinct keys (nets) of this rank's share of an epoch."""
        return set(self.epoch_keys(self.epoch if epoch is None else epoch))

    def padding_fraction(self, epoch: int | None = None) -> float:
        """Padded slots / all slots over this rank's batches of an epoch (both directions
        counted)."""
        slots = real = 0
        dirs = 2 if self.direction == "bidirectional" else 1
        for batch, key in self._plan(self.epoch if epoch is None else epoch):
            slots += sum(map(sum, key)) if dirs == 2 else sum(key)
            real += dirs * int(self.sizes[batch].sum())
        return 1.0 - real / slots

    def __repr__(self) -> str:
        share = f", rank {self.rank} of {self.size}" if self.size > 1 else ""
        return (f"TreeBucketSampler({len(self.trees)} trees, batch_size={self.batch_size}, "
                f"direction={self.direction!r}, {len(self)} batches{share})")
