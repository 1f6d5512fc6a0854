"""Length buckets: a batch sampler that groups sequences by length, and time-major padding.

Each batch comes from one bucket and is padded to that bucket's length, so one
unrolled net per bucket length suffices (built on demand and cached by length).

>>> sampler = BucketSampler([3, 5, 4, 9, 8, 2], batch_size=2, boundaries=[4, 9], shuffle=False)
>>> sampler.bucket_lengths
(4, 9)
>>> list(sampler)
[[0, 2], [5], [1, 3], [4]]
>>> values, cont = time_major([[7, 8, 9], [5]], length=3)
>>> values.T.tolist(), cont.T.tolist()
([[7, 8, 9], [5, 0, 0]], [[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "BucketSampler",
    "Span",
    "choose_boundaries",
    "choose_row_lengths",
    "cont_from_lengths",
    "cont_from_packed_lengths",
    "time_major",
    "time_major_packed",
    "unpack_time_major",
]


def _as_int(value, what: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def _check_lengths(lengths) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D sequence of integers, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("lengths is empty: there are no sequences to batch")
    if not np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype} (e.g. {arr[0]!r})")
    bad = np.flatnonzero(arr < 1)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"lengths[{i}] = {int(arr[i])}: every length must be >= 1")
    return arr.astype(np.int64)


def choose_boundaries(
    lengths, min_size: int = 32, max_padding: float = 0.05, by_tokens: bool = False
) -> list[int]:
    """Bucket boundaries for ``lengths`` that keep each bucket's padding small (greedy).

    Walks the distinct lengths in increasing order, adding all sequences of each
    length to the open bucket. The bucket is closed (its boundary is the last
    length added) just before a length whose addition would push the bucket's
    padding fraction, ``1 - sum(lengths) / (count * longest)``, above
    ``max_padding`` -- but only once the bucket can fill one batch: ``min_size``
    sequences, or with ``by_tokens`` ``min_size`` padded tokens. So every bucket
    pads at most ``max_padding`` of its positions, except one that had to grow to
    fill a batch (sparse long sequences) and the last one, which may be smaller
    than a batch. The last boundary is the longest length.

    >>> choose_boundaries([1, 1, 2, 2, 5, 5, 6, 9], min_size=2, max_padding=0.3)
    [2, 6, 9]
    """
    arr = _check_lengths(lengths)
    min_size = _as_int(min_size, "min_size", 1)
    if not 0.0 <= max_padding < 1.0:
        raise ValueError(f"max_padding must be in [0, 1), got {max_padding}")
    values, counts = np.unique(arr, return_counts=True)
    bounds: list[int] = []
    n = total = prev = 0  # open bucket: sequence count, token sum, longest length
    for length, count in zip(values.tolist(), counts.tolist()):
        if n:
            full = n * prev >= min_size if by_tokens else n >= min_size
            padding = 1.0 - (total + length * count) / ((n + count) * length)
            if full and padding > max_padding:
                bounds.append(prev)
                n = total = 0
        n += count
        total += length * count
        prev = length
    bounds.append(prev)
    return bounds


def choose_row_lengths(lengths, shortest: int | None = None) -> list[int]:
    """Row lengths for packing: ``shortest``, doubled while under half the longest; the longest.

    ``shortest`` defaults to the 95th percentile of ``lengths``, so most
    sequences fit the shortest rows and share them; longer ones open longer
    rows, whose room the short ones fill. On UD English EWT train: [39, 78, 159].

    >>> choose_row_lengths([2, 3, 3, 4, 20], shortest=4)
    [4, 8, 20]
    """
    arr = _check_lengths(lengths)
    longest = int(arr.max())
    if shortest is None:
        shortest = int(np.percentile(arr, 95, method="higher"))
    row = _as_int(shortest, "shortest", 1)
    out = []
    while 2 * row < longest:
        out.append(row)
        row *= 2
    return [*out, longest]


def _first_fit_decreasing(lengths: np.ndarray, room: np.ndarray) -> tuple[list[int], list[int]]:
    """Pack items, longest first, each into the first row with room, else a new row.

    ``lengths`` are sorted decreasing; ``room[k]`` is the length of the row item
    k opens when none has room. Returns (row of each item, length of each row).
    The rows' remaining room sits in a max-segment tree, so the first row with
    room for an item is found in O(log rows).
    """
    size = 1 << max(1, (len(lengths) - 1).bit_length())
    tree = [0] * (2 * size)  # leaves: room left in row i (0 until opened)
    rows: list[int] = []
    placed: list[int] = []
    for length, opens in zip(lengths.tolist(), room.tolist()):
        if tree[1] >= length:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= length else 2 * node + 1
        else:
            node = size + len(rows)
            rows.append(opens)
            tree[node] = opens
        placed.append(node - size)
        tree[node] -= length
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return placed, rows


class BucketSampler:
    """Batches of sequence indices, each batch from one length bucket; reshuffled per epoch.

    ``lengths[i]`` is the length of sequence ``i``. Iterating yields one epoch:
    lists of int indices into ``lengths``, every sequence exactly once (with
    ``drop_last``, each bucket's last incomplete batch is left out).

    Buckets. ``boundaries`` are strictly increasing upper limits: a sequence of
    length L goes to the first bucket whose boundary is >= L; longer ones go to
    a final bucket that reaches the longest length. ``None`` chooses them with
    :func:`choose_boundaries` with ``min_size=batch_size`` and ``max_padding=0.05``
    (each bucket pads at most 5% once it can fill a batch; on UD English EWT
    train, batch_size=32: 27 buckets, 3.9% padding against 90% for one bucket).
    A batch is padded to its bucket's length:
    the bucket's boundary capped at its longest member, i.e. the longest length
    in the bucket, the same for every batch of that bucket and every epoch
    (:meth:`bucket_length`), so one unrolled net per bucket is enough.

    Batch size. ``batch_size`` sequences per batch; with ``by_tokens=True`` it is
    a budget of padded tokens instead: a batch of a bucket of length L holds
    ``batch_size // L`` sequences, at least one -- so a single sequence longer
    than the budget still makes a batch of its own, the one case over budget.

    Order. With ``shuffle``, each epoch shuffles the sequences within every
    bucket and then the order of all batches across buckets, from an RNG
    derived from ``(seed, epoch)``: epoch k gives the same batches for the same
    seed, whatever happened before. Each ``iter()`` uses the current epoch and
    advances the counter; :meth:`set_epoch` sets it. Without ``shuffle``,
    batches come bucket by bucket, shortest first, indices in input order.

    Data-parallel sharding. With ``size`` ranks, rank ``rank`` takes every
    ``size``-th batch of the epoch from position ``rank`` on: the ranks derive
    one order from the shared ``seed``, and step ``i`` of rank ``r`` is batch
    ``i * size + r``, so a step of all ranks together sees the batches one
    process with ``iter_size: size`` would. Every rank gets ``n // size``
    batches of an epoch's ``n``: the last ``n % size`` batches (fewer than
    ``size``; with ``shuffle``, different ones each epoch) are left out, so that
    no rank waits for a step the others never take.

    Packing. With ``pack=True`` a batch is a list of ROWS, each a list of
    sequence indices to be put back to back (:func:`time_major_packed`: cont
    is 0 at each sequence's start, so each gets the result it gets alone), and
    ``bucket_length(batch)`` is the row length. The ``boundaries`` are then the
    row lengths (``None``: :func:`choose_row_lengths`, a few doublings up to
    the longest length; on EWT train [39, 78, 159] and 0.02% padding). Each
    epoch packs every sequence by first-fit decreasing: longest first (ties in
    the epoch's shuffled order), into the first row opened with room for it,
    else into a new row of its bucket's length (the first boundary >= its
    length; beyond the last boundary, the longest length). A batch holds
    ``batch_size`` rows of one length (``by_tokens``: ``batch_size // L`` rows,
    at least one), except the last batch of each row length, which may hold
    fewer; ``drop_last`` leaves that one out. Rows and batches are shuffled as
    above; without ``shuffle``, ties keep input order and batches come
    shortest row length first. Which lengths share a row depends only on the
    lengths, so ``len()`` and ``bucket_lengths`` hold for every epoch; which
    sequences of those lengths fill the row changes with the shuffle.

    >>> s = BucketSampler([5, 3, 12, 4, 11], batch_size=2, boundaries=[5], seed=1)
    >>> s.bucket_lengths, len(s)
    ((5, 12), 3)
    >>> [sorted(b) for b in s.epoch_batches(0)] == [sorted(b) for b in s]
    True
    >>> s.epoch, s.bucket_length([2, 4]), round(s.padding_fraction(), 3)
    (1, 12, 0.103)
    >>> p = BucketSampler([5, 3, 12, 4, 2], batch_size=2, boundaries=[8], pack=True, shuffle=False)
    >>> p.bucket_lengths, p.epoch_batches(0), round(p.padding_fraction(), 3)
    ((8, 12), [[[0, 1], [3, 4]], [[2]]], 0.071)
    """

    #: ``max_padding`` used to choose boundaries when none are given
    DEFAULT_MAX_PADDING = 0.05

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int = 32,
        boundaries: Sequence[int] | None = None,
        seed: int = 0,
        by_tokens: bool = False,
        shuffle: bool = True,
        drop_last: bool = False,
        rank: int = 0,
        size: int = 1,
        pack: bool = False,
    ):
        self.lengths = _check_lengths(lengths)
        self.size = _as_int(size, "size", 1)
        self.rank = _as_int(rank, "rank", 0)
        if self.rank >= self.size:
            raise ValueError(f"rank must be in 0..size-1 = 0..{self.size - 1}, got {self.rank}")
        self.batch_size = _as_int(batch_size, "batch_size", 1)
        self.seed = _as_int(seed, "seed", 0)
        self.by_tokens, self.shuffle = bool(by_tokens), bool(shuffle)
        self.drop_last, self.pack = bool(drop_last), bool(pack)
        if boundaries is None and self.pack:
            boundaries = choose_row_lengths(self.lengths)
        elif boundaries is None:
            boundaries = choose_boundaries(
                self.lengths, self.batch_size, self.DEFAULT_MAX_PADDING, self.by_tokens
            )
        self.boundaries = self._check_boundaries(boundaries)
        self.epoch = 0

        # bucket id per sequence: first boundary >= length; len(boundaries) = overflow bucket
        ids = np.searchsorted(np.asarray(self.boundaries, np.int64), self.lengths, side="left")
        if self.pack:
            self._plan_packing(ids)
            return
        used = np.unique(ids)
        #: index arrays of the non-empty buckets, in increasing length order
        self._buckets = [np.flatnonzero(ids == b) for b in used.tolist()]
        self._bucket_of = np.searchsorted(used, ids)  # sequence -> position in _buckets
        #: padded length of each non-empty bucket, shortest first
        self.bucket_lengths = tuple(int(self.lengths[idx].max()) for idx in self._buckets)
        self._batch_sizes = [self._rows_per_batch(L) for L in self.bucket_lengths]

    def _rows_per_batch(self, length: int) -> int:
        return max(1, self.batch_size // length) if self.by_tokens else self.batch_size

    def _plan_packing(self, ids: np.ndarray) -> None:
        """Pack the lengths once: every epoch's packing has the same shape (see the class doc)."""
        #: row length of each sequence's bucket: its boundary, beyond the last the longest length
        self._row_length_of = np.append(self.boundaries, self.lengths.max())[ids]
        order = np.argsort(-self.lengths, kind="stable")
        self._slot_rows, self._row_lengths = _first_fit_decreasing(
            self.lengths[order], self._row_length_of[order]
        )
        self.bucket_lengths = tuple(sorted(set(self._row_lengths)))
        counts = np.bincount(self._row_lengths)
        self._batch_sizes = [self._rows_per_batch(L) for L in self.bucket_lengths]
        self._rows_of_length = [int(counts[L]) for L in self.bucket_lengths]

    @staticmethod
    def _check_boundaries(boundaries) -> tuple[int, ...]:
        out = tuple(_as_int(b, f"boundaries[{i}]", 1) for i, b in enumerate(boundaries))
        if not out:
            raise ValueError("boundaries is empty: give at least one, or None to choose them")
        for i in range(1, len(out)):
            if out[i] <= out[i - 1]:
                raise ValueError(
                    f"boundaries must be strictly increasing: boundaries[{i}] = {out[i]} "
                    f"after boundaries[{i - 1}] = {out[i - 1]}"
                )
        return out

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (the counter then advances from there)."""
        self.epoch = _as_int(epoch, "epoch", 0)

    def epoch_batches(self, epoch: int) -> list:
        """This rank's batches of epoch ``epoch``, without touching the epoch counter.

        Each batch is a list of indices, or with ``pack`` a list of rows of indices.
        """
        batches = self._all_batches(_as_int(epoch, "epoch", 0))
        steps = len(batches) // self.size
        return batches[self.rank : steps * self.size : self.size]

    def _all_batches(self, epoch: int) -> list:
        """The batches of epoch ``epoch`` over all ranks, in the order they are dealt."""
        rng = np.random.default_rng([self.seed, epoch])
        groups = self._packed_rows(rng) if self.pack else [idx.tolist() for idx in self._buckets]
        batches: list = []
        for group, bs in zip(groups, self._batch_sizes):
            if self.shuffle:
                group = [group[k] for k in rng.permutation(len(group)).tolist()]
            stop = len(group) - len(group) % bs if self.drop_last else len(group)
            batches.extend(group[i : i + bs] for i in range(0, stop, bs))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches)).tolist()]
        return batches

    def _packed_rows(self, rng) -> list[list[list[int]]]:
        """This epoch's rows, grouped by row length (shortest first); see the class doc.

        The same as packing the shuffled sequences from scratch: items of one
        length are interchangeable, so the k-th of them (in the shuffled
        order) takes the slot the k-th took when the lengths were packed.
        """
        n = len(self.lengths)
        perm = rng.permutation(n) if self.shuffle else np.arange(n)
        order = perm[np.argsort(-self.lengths[perm], kind="stable")]
        rows: list[list[int]] = [[] for _ in self._row_lengths]
        for row, i in zip(self._slot_rows, order.tolist()):
            rows[row].append(i)
        return [[r for r, L in zip(rows, self._row_lengths) if L == length]
                for length in self.bucket_lengths]

    def __iter__(self) -> Iterator[list]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter(self.epoch_batches(epoch))

    def __len__(self) -> int:
        """Batches per epoch (of this rank: the steps every rank takes)."""
        rounding = operator.floordiv if self.drop_last else lambda n, bs: math.ceil(n / bs)
        counts = self._rows_of_length if self.pack else [len(idx) for idx in self._buckets]
        total = sum(rounding(n, bs) for n, bs in zip(counts, self._batch_sizes))
        return total // self.size

    @property
    def num_buckets(self) -> int:
        """Number of non-empty buckets (= distinct padded or row lengths = unrolled nets needed)."""
        return len(self.bucket_lengths)

    def bucket_length(self, batch: Sequence) -> int:
        """The length ``batch`` is padded to: its bucket's longest length (<= its boundary).

        With ``pack``, ``batch`` is a list of rows and this is their row length.
        """
        if self.pack:
            return self._row_length(batch)
        idx = np.asarray(batch, dtype=np.int64)
        if idx.ndim != 1 or idx.size == 0:
            raise ValueError(f"batch must be a non-empty list of indices, got {batch!r}")
        if idx.min() < 0 or idx.max() >= len(self.lengths):
            raise ValueError(f"batch has indices outside 0..{len(self.lengths) - 1}: {batch!r}")
        buckets = np.unique(self._bucket_of[idx])
        if buckets.size != 1:
            found = [self.bucket_lengths[b] for b in buckets.tolist()]
            raise ValueError(f"batch mixes buckets of lengths {found}: {batch!r}")
        return self.bucket_lengths[int(buckets[0])]

    def _row_length(self, batch) -> int:
        """The row length of a packed batch: that of its rows' longest members' bucket."""
        if not isinstance(batch, Sequence) or not batch:
            raise ValueError(f"a packed batch must be a non-empty list of rows, got {batch!r}")
        found = set()
        for r, row in enumerate(batch):
            if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or not row:
                raise ValueError(f"row {r} of a packed batch must be a non-empty list of "
                                 f"indices, got {row!r}")
            idx = np.asarray(row)
            if not np.issubdtype(idx.dtype, np.integer) or idx.ndim != 1:
                raise ValueError(f"row {r} of a packed batch must hold indices, got {row!r}")
            if idx.min() < 0 or idx.max() >= len(self.lengths):
                raise ValueError(f"row {r} has indices outside 0..{len(self.lengths) - 1}: {row!r}")
            length = int(self._row_length_of[idx].max())
            if int(self.lengths[idx].sum()) > length:
                raise ValueError(f"row {r} holds {int(self.lengths[idx].sum())} tokens, more "
                                 f"than its row length {length}: {row!r}")
            found.add(length)
        if len(found) != 1:
            raise ValueError(f"batch mixes rows of lengths {sorted(found)}: {batch!r}")
        return found.pop()

    def padding_fraction(self, epoch: int | None = None) -> float:
        """Padded positions / all positions over one epoch (default: the current one).

        ``sum(L_b * n_b - sum of lengths in b) / sum(L_b * n_b)`` over the
        epoch's batches b (this rank's), with ``L_b = bucket_length(b)`` and ``n_b``
        sequences (with ``pack``, rows). Only ``drop_last`` and sharding make it
        depend on the epoch.
        """
        batches = self.epoch_batches(self.epoch if epoch is None else epoch)
        padded = real = 0
        for batch in batches:
            padded += self.bucket_length(batch) * len(batch)
            real += int(sum(self.lengths[row].sum() for row in batch) if self.pack
                        else self.lengths[batch].sum())
        return (padded - real) / padded if padded else 0.0

    def __repr__(self) -> str:
        return (
            f"BucketSampler({len(self.lengths)} sequences, batch_size={self.batch_size}, "
            f"by_tokens={self.by_tokens}, pack={self.pack}, buckets={list(self.bucket_lengths)})"
        )


def _continues(continues, n: int) -> np.ndarray:
    flags = np.broadcast_to(np.asarray(continues), (n,)) if np.ndim(continues) == 0 else \
        np.asarray(continues)
    if flags.shape != (n,) or flags.dtype != np.bool_:
        raise ValueError(f"continues must be a bool or one bool per sequence ({n}), "
                         f"got {continues!r}")
    return flags


def time_major(sequences, length: int, pad_value=0, align: str = "left",
               continues=False) -> tuple[np.ndarray, np.ndarray]:
    """Pad sequences into a time-major ``(T, N, ...)`` array, with a ``cont`` mask ``(T, N)``.

    With ``align="left"`` (the default) ``values[t, n] = sequences[n][t]`` for
    ``t < len_n``, padding after; with ``align="right"`` the padding comes
    first, so step T-1 holds every sequence's last item (what a many-to-one
    ``recurrent(..., sequence_output=False)`` reads). Items may be scalars or
    arrays of one shape (giving ``(T, N, *item_shape)``). ``cont`` is that of
    :func:`cont_from_lengths` (same ``align`` and ``continues``).

    >>> v, c = time_major([[1, 2], [3, 4, 5]], length=4, pad_value=-1)
    >>> v.tolist()
    [[1, 3], [2, 4], [-1, 5], [-1, -1]]
    >>> c.tolist()
    [[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    >>> v, c = time_major([[1, 2], [3, 4, 5]], length=3, align="right")
    >>> v.T.tolist(), c.T.tolist()
    ([[0, 1, 2], [3, 4, 5]], [[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    """
    T = _as_int(length, "length", 0)
    _check_align(align)
    seqs = [np.asarray(s) for s in sequences]
    item_shape, first = None, 0
    for n, s in enumerate(seqs):
        if s.ndim == 0:
            raise ValueError(f"sequence {n} is a scalar, not a sequence: {s!r}")
        if len(s) > T:
            raise ValueError(f"sequence {n} has length {len(s)} > padded length {T}")
        if len(s) and item_shape is None:
            item_shape, first = s.shape[1:], n
        elif len(s) and s.shape[1:] != item_shape:
            raise ValueError(
                f"sequence {n} has items of shape {s.shape[1:]}, "
                f"sequence {first} has items of shape {item_shape}"
            )
    nonempty = [s for s in seqs if len(s)]
    dtype = np.result_type(*nonempty) if nonempty else np.asarray(pad_value).dtype
    values = np.full((T, len(seqs)) + (item_shape or ()), pad_value, dtype=dtype)
    for n, s in enumerate(seqs):
        if len(s):
            if align == "left":
                values[: len(s), n] = s
            else:
                values[T - len(s):, n] = s
    return values, cont_from_lengths([len(s) for s in seqs], T, align, continues)


def _check_align(align) -> None:
    if align not in ("left", "right"):
        raise ValueError(f"align must be 'left' or 'right', got {align!r}")


def cont_from_lengths(lengths, length: int, align: str = "left", continues=False) -> np.ndarray:
    """The ``cont`` mask (T, N) of sequences of ``lengths`` padded to ``length`` (float32).

    1 inside a sequence, 0 at its first step and at padding: 0 tells the
    forward recurrence to start from its initial state, and the reverse one
    to start at each sequence's end. ``align="right"`` puts the padding first
    (see :func:`time_major`). ``continues`` (a bool, or one per sequence)
    marks streams whose chunk carries on from the previous chunk (truncated
    BPTT with ``expose_hidden`` and :func:`unroll.carry_hidden`): their step 0
    gets cont 1, so the carried state flows in. A continuing stream must be
    left-aligned: padding before it would cut it.

    >>> cont_from_lengths([2, 3], 4).T.tolist()
    [[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]
    >>> cont_from_lengths([2, 3], 3, align="right").T.tolist()
    [[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]]
    >>> cont_from_lengths([3, 1], 3, continues=[True, False]).T.tolist()
    [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    """
    T = _as_int(length, "length", 0)
    _check_align(align)
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.ndim != 1:
        raise ValueError(f"lengths must be a 1-D sequence of integers, got shape {lens.shape}")
    if lens.size and (lens.min() < 0 or lens.max() > T):
        bad = int(np.flatnonzero((lens < 0) | (lens > T))[0])
        raise ValueError(f"lengths[{bad}] = {int(lens[bad])} is not in 0..{T} (length)")
    carry = _continues(continues, lens.size)
    if align == "right" and (carry & (lens < T)).any():
        bad = int(np.flatnonzero(carry & (lens < T))[0])
        raise ValueError(
            f"sequence {bad} continues from the previous chunk but is right-aligned with "
            f"padding before it (length {int(lens[bad])} < {T}); pad continuing streams at the "
            f"end (align='left')"
        )
    t = np.arange(T)[:, None]
    start = np.zeros_like(lens) if align == "left" else T - lens
    cont = (t > start[None, :]) & (t < (start + lens)[None, :])
    if T:
        cont[0] |= carry & (lens > 0)
    return cont.astype(np.float32)


class Span(NamedTuple):
    """Where a packed sequence lies: steps ``offset .. offset + length - 1`` of column ``row``."""

    row: int
    offset: int
    length: int


def cont_from_packed_lengths(rows, length: int) -> np.ndarray:
    """The ``cont`` mask (T, R) of rows of sequences put back to back, padded to ``length``.

    ``rows[r]`` lists the lengths of the sequences in row r, in order: cont
    is 0 at each one's first step (its recurrence restarts there, and the
    reverse direction ends the previous one there) and at padding, else 1.

    >>> cont_from_packed_lengths([[2, 3], [4]], 6).T.tolist()
    [[0.0, 1.0, 0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]]
    """
    T = _as_int(length, "length", 0)
    cont = np.zeros((T, len(rows)), np.float32)
    for r, lengths in enumerate(rows):
        offset = 0
        for k, n in enumerate(lengths):
            n = _as_int(n, f"rows[{r}][{k}]", 1)
            if offset + n > T:
                raise ValueError(f"row {r} holds {int(sum(lengths))} steps, more than its "
                                 f"length {T}")
            cont[offset + 1 : offset + n, r] = 1
            offset += n
    return cont


def time_major_packed(rows, sequences, length: int, pad_value=0):
    """Put the sequences of each row back to back in a ``(T, R, ...)`` array, with cont and spans.

    ``rows`` is a packed batch (``BucketSampler(pack=True)``): ``rows[r]``
    lists indices into ``sequences``. Returns ``(values, cont, spans)``:
    ``values[:, r]`` is row r's sequences one after another, then
    ``pad_value``; ``cont`` is :func:`cont_from_packed_lengths`; ``spans`` is
    the :class:`Span` of each sequence, in the order ``[i for row in rows for
    i in row]`` (what :func:`unpack_time_major` takes back out).

    >>> values, cont, spans = time_major_packed([[0, 2], [1]], [[7, 8], [5, 6, 4], [9]], 3)
    >>> values.T.tolist(), cont.T.tolist()
    ([[7, 8, 9], [5, 6, 4]], [[0.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    >>> [tuple(s) for s in spans]  # (row, offset, length)
    [(0, 0, 2), (0, 2, 1), (1, 0, 3)]
    """
    row_values, row_lengths, spans = [], [], []
    for r, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or not row:
            raise ValueError(f"row {r} must be a non-empty list of sequence indices, got {row!r}")
        parts = [np.asarray(sequences[i]) for i in row]
        offset = 0
        for i, part in zip(row, parts):
            if part.ndim == 0 or len(part) == 0:
                raise ValueError(f"sequence {i} (row {r}) must be a non-empty sequence, got "
                                 f"{part!r}")
            spans.append(Span(r, offset, len(part)))
            offset += len(part)
        try:
            row_values.append(np.concatenate(parts))
        except ValueError:
            shapes = {i: p.shape[1:] for i, p in zip(row, parts)}
            raise ValueError(f"row {r}: its sequences have items of different shapes "
                             f"{shapes}") from None
        row_lengths.append([len(p) for p in parts])
    cont = cont_from_packed_lengths(row_lengths, length)
    values, _ = time_major(row_values, length, pad_value=pad_value)
    return values, cont, spans


def unpack_time_major(array, spans) -> list:
    """Each sequence's steps out of a packed time-major ``(T, R, ...)`` array, one per span.

    >>> _, _, spans = time_major_packed([[0, 1]], [[1, 2], [3]], 4)
    >>> [a.tolist() for a in unpack_time_major(np.arange(8).reshape(4, 1, 2), spans)]
    [[[0, 1], [2, 3]], [[4, 5]]]
    """
    T, R = np.shape(array)[:2]
    out = []
    for k, (row, offset, length) in enumerate(spans):
        if not (0 <= row < R and 0 <= offset and offset + length <= T):
            raise ValueError(f"span {k} {Span(row, offset, length)} lies outside the array of "
                             f"T={T} steps and {R} rows")
        out.append(array[offset : offset + length, row])
    return out
