"""Greedy decoding, sampling and beam search over a Stepper: one step of every live hypothesis
a call.

A decoder is anything with ``step(tokens)``, which takes the last token of each of M
hypotheses, (M,) ints, advances their states one step and returns the log probabilities
of the next token, (M, V), and ``reorder(rows)``, after which hypothesis i continues
the state of hypothesis ``rows[i]`` (``rows`` may be shorter or longer than M: the
batch shrinks as hypotheses end, by halves since each new batch size costs the step net
a reshape, and grows into a beam). :class:`StepperDecoder` is one
over a :class:`~unroll.train.stepper.Stepper`, with static inputs such as an attention
memory that every step reads (docs/design.md, "Stepping").

A hypothesis ends when it emits ``eos`` (which it keeps out of its tokens) or reaches
``max_len`` tokens; its score is the sum of its tokens' log probabilities (``eos``
included). Each function returns one (tokens, score) per sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from unroll.train.stepper import Stepper

__all__ = ["StepperDecoder", "beam_search", "best_extensions", "greedy", "sample"]


class StepperDecoder:
    """A Stepper over a one-step decoder net, as :func:`greedy` and :func:`beam_search`
    drive it: the tokens go in as input ``token`` (1, M) (or (1, M, 1), where the net's
    input has three axes) with ``cont`` (1, M) ones, and output ``output`` (1, M, V) holds
    the next token's probabilities (``log=True``: log probabilities).

    ``static`` gives the inputs every step reads as they are, such as an attention memory
    (S, N, H), its mask (S, N) or a per-sequence feature (N, ...): their batch axis follows
    the hypotheses through every reorder. It is ``batch_axes[name]`` where given, else the
    one axis that the step net declares as big as its batch (the size of its cont's axis
    1), else the one axis of the value as big as the batch of the states given to
    :meth:`start`, which begins each sequence from its states.

    >>> import unroll
    >>> make = lambda T: unroll.expand("gru", steps=T, batch=2, input_dim=1, hidden=3,
    ...                                expose_hidden=True)
    >>> stepper = unroll.Stepper(make(1))
    >>> decoder = StepperDecoder(stepper, token="x", output="h", log=True)
    >>> decoder.start({"h_0": np.zeros((1, 2, 3))})
    >>> decoder.step(np.array([1, 2])).shape    # the net's "h" read as 3 log probabilities
    (2, 3)
    """

    def __init__(self, stepper: Stepper, token: str = "tokens", cont: str = "cont",
                 output: str = "probs", static: dict | None = None,
                 batch_axes: dict | None = None, log: bool = False):
        self.stepper, self.token, self.cont, self.output, self.log = (
            stepper, token, cont, output, log)
        needs = {token, cont, *(static or {})}
        missing = sorted(needs - set(stepper.inputs))
        if missing:
            raise ValueError(f"StepperDecoder: {missing} are not inputs of the step net "
                             f"'{stepper.net.name}' (inputs: {stepper.inputs})")
        unread = sorted(set(stepper.inputs) - needs)
        if unread:
            raise ValueError(f"StepperDecoder: the step net also needs {unread}; give them "
                             f"as static inputs: static={{{unread[0]!r}: ...}}")
        self.static = {name: np.asarray(value) for name, value in (static or {}).items()}
        self._axes_given = dict(batch_axes or {})
        #: {static input: its batch axis}, complete once :meth:`start` has run
        self.batch_axes = self._batch_axes(None)
        self._rows_static = dict(self.static)
        # the row of the static inputs each hypothesis reads (None: its own, as given)
        self._origin: np.ndarray | None = None
        # the static inputs, as the rows are now, go into the net once before the next step
        # (Stepper.set_static), not on every step, and only when a row's sequence changes:
        # greedy decoding moves them only when its batch shrinks, beam search (whose rows
        # stay with their sequence) only when a search ends
        self._unset = True

    def _batch_axes(self, batch: int | None) -> dict:
        """Each static input's batch axis, where it is known: given, or the one axis the
        net declares of its batch's size, or (with ``batch``) the one the value has."""
        net_batch = self.stepper.declared[self.cont][1]
        axes = {}
        for name, value in self.static.items():
            if name in self._axes_given:
                axes[name] = self._axes_given[name]
                continue
            declared = self.stepper.declared[name]
            found = [a for a, size in enumerate(declared) if size == net_batch]
            if len(found) > 1 and batch is not None:
                found = [a for a in found if value.shape[a] == batch]
            if len(found) == 1:
                axes[name] = found[0]
            elif batch is not None:
                raise ValueError(
                    f"StepperDecoder: cannot tell the batch axis of static input '{name}' "
                    f"{value.shape} (the net declares it {declared}, for a batch of "
                    f"{net_batch}; the states hold {batch}); say it: batch_axes={{{name!r}: ...}}")
        return axes

    def start(self, state: dict) -> None:
        """Begin every sequence from ``state`` ({X_0: (1, N, size)}, as :meth:`Stepper.reset`
        takes it), one hypothesis per sequence, with the static inputs as given."""
        self.stepper.reset(state)
        if len(self.batch_axes) < len(self.static):
            self.batch_axes = self._batch_axes(np.shape(next(iter(state.values())))[1])
        self._rows_static, self._origin, self._unset = dict(self.static), None, True

    def step(self, tokens) -> np.ndarray:
        """The log probabilities (M, V) of the next token after each hypothesis' ``tokens``."""
        tokens = np.asarray(tokens, dtype=np.float64)[None]
        ndim = len(self.stepper.declared[self.token])
        if self._unset:
            self.stepper.set_static(**self._rows_static)
            self._unset = False
        out = self.stepper(**{self.token: tokens.reshape(*tokens.shape, *[1] * (ndim - 2)),
                              self.cont: np.ones_like(tokens)})[self.output]
        values = np.asarray(out, dtype=np.float64).reshape(tokens.shape[1], -1)
        return values if self.log else np.log(np.maximum(values, 1e-30))

    def reorder(self, rows) -> None:
        """Hypothesis i continues hypothesis ``rows[i]``: its states and its static inputs."""
        rows = np.asarray(rows, dtype=np.int64)
        self.stepper.reorder(rows)
        origin = rows if self._origin is None else self._origin[rows]
        if self._origin is None or not np.array_equal(origin, self._origin):
            self._rows_static = {name: np.take(value, origin, axis=self.batch_axes[name])
                                 for name, value in self.static.items()}
            self._unset = self._unset or bool(self._rows_static)
        self._origin = origin


def greedy(decoder, batch: int, bos: int, eos: int, max_len: int) -> list[tuple[list[int], float]]:
    """The most probable token at every step, for ``batch`` sequences at once (the decoder
    started with one hypothesis each); the hypotheses that end leave the batch once half
    of it has ended (:data:`SHRINK_AT`).

    >>> # p(next | previous) over eos, a, b (and bos, which only starts)
    >>> p = [[1, 0, 0, 0], [.4, .3, .3, 0], [1, 0, 0, 0], [0, .6, .4, 0]]
    >>> table = TableDecoder(np.log(np.array(p) + 1e-12))
    >>> [(tokens, round(float(np.exp(score)), 3)) for tokens, score in
    ...  greedy(table, batch=1, bos=3, eos=0, max_len=5)]
    [([1], 0.24)]
    """
    return _one_best(decoder, batch, bos, eos, max_len, lambda logp: logp.argmax(axis=1))


def sample(decoder, batch: int, bos: int, eos: int, max_len: int, seed: int = 0,
           temperature: float = 1.0) -> list[tuple[list[int], float]]:
    """Each next token drawn from the decoder's distribution (sharpened by ``temperature``
    < 1), from a generator seeded with ``seed``, so a run repeats; the score is the
    untempered log probability of what was drawn.

    >>> p = [[1, 0, 0, 0], [.4, .3, .3, 0], [1, 0, 0, 0], [0, .6, .4, 0]]
    >>> table = TableDecoder(np.log(np.array(p) + 1e-12))
    >>> sample(table, 3, bos=3, eos=0, max_len=5, seed=1) == sample(table, 3, 3, 0, 5, seed=1)
    True
    """
    if temperature <= 0:
        raise ValueError(f"sample: temperature must be > 0, found {temperature}")
    rng = np.random.default_rng(seed)

    def draw(logp):
        z = logp / temperature
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return (rng.random((len(p), 1)) > p.cumsum(axis=1)).sum(axis=1).clip(0, p.shape[1] - 1)

    return _one_best(decoder, batch, bos, eos, max_len, draw)


#: the batch shrinks to its live rows once at most this share of its rows live: each new
#: batch size costs the step net a reshape, so rows that ended step on, unread, until then
SHRINK_AT = 0.5


def _one_best(decoder, batch: int, bos: int, eos: int, max_len: int,
              pick: Callable) -> list[tuple[list[int], float]]:
    """One hypothesis per sequence, extended by ``pick(logp)`` of the live ones."""
    out: list[list[int]] = [[] for _ in range(batch)]
    scores = np.zeros(batch)
    of_row = np.arange(batch)  # the sequence of each row of the batch; -1: it ended
    tokens = np.full(batch, bos, dtype=np.int64)
    for _ in range(max_len):
        logp = decoder.step(tokens)
        at = np.flatnonzero(of_row >= 0)
        live = of_row[at]
        picked = np.asarray(pick(logp[at]), dtype=np.int64)
        scores[live] += logp[at, picked]
        going = picked != eos
        for i, token in zip(live[going].tolist(), picked[going].tolist()):
            out[i].append(token)
        if not going.any():
            break
        tokens[at] = picked
        of_row[at[~going]] = -1
        if going.sum() <= SHRINK_AT * len(of_row):
            rows = np.flatnonzero(of_row >= 0)
            decoder.reorder(rows)
            of_row, tokens = of_row[rows], tokens[rows]
    return list(zip(out, scores.tolist()))


def beam_search(decoder, batch: int, bos: int, eos: int, max_len: int,
                beam: int = 4) -> list[tuple[list[int], float]]:
    """The highest-scoring hypothesis of a beam of ``beam`` for each of ``batch`` sequences
    (the decoder started with one hypothesis each, which the search copies into its beam).

    Each step ranks, per sequence, every extension of its live hypotheses: one that ends
    in ``eos`` among the ``beam`` best is finished, and the ``beam`` best that do not end
    make the next beam (so beam 1 is greedy decoding). The search of a sequence stops once
    its best finished score is at least its best live one (scores only fall), or at
    ``max_len``; a sequence with nothing finished then takes its best live one. The rows
    of a sequence in the batch stay together; those of stopped searches leave it once
    half of it has stopped (:data:`SHRINK_AT`), stepping on unread until then.

    >>> p = [[1, 0, 0, 0], [.4, .3, .3, 0], [1, 0, 0, 0], [0, .6, .4, 0]]
    >>> table = TableDecoder(np.log(np.array(p) + 1e-12))
    >>> [(tokens, round(float(np.exp(score)), 3)) for tokens, score in beam_search(
    ...  table, 1, bos=3, eos=0, max_len=5, beam=2)]
    [([2], 0.4)]
    """
    k = beam
    if k < 1:
        raise ValueError(f"beam_search: beam must be >= 1, found {beam}")
    active = list(range(batch))  # the sequences still searched, k rows each, in order
    decoder.reorder(np.repeat(np.arange(batch), k))
    tokens = np.full(batch * k, bos, dtype=np.int64)
    # every row of a sequence starts alike: only its first may extend at step one
    scores = np.tile(np.r_[0.0, np.full(k - 1, -np.inf)], batch)
    prefixes: list[list[int]] = [[] for _ in range(batch * k)]
    best: list[tuple[list[int], float] | None] = [None] * batch
    for _ in range(max_len):
        logp = decoder.step(tokens)[:len(scores)]  # after them, rows of ended searches
        vocab = logp.shape[1]
        total = (scores[:, None] + logp).reshape(len(active), k * vocab)
        # the 2k best extensions of each sequence hold at least k that do not end (or the
        # beam is spent); ranked for every sequence at once, read as Python numbers
        ranked = best_extensions(total, 2 * k)
        ranked_values = np.take_along_axis(total, ranked, axis=1).tolist()
        rows, new_tokens, new_scores, new_prefixes, still = [], [], [], [], []
        for j, (b, flats, values) in enumerate(zip(active, ranked.tolist(), ranked_values)):
            beam_rows = []
            for rank, (flat, value) in enumerate(zip(flats, values)):
                if not math.isfinite(value):
                    break
                row, token = j * k + flat // vocab, flat % vocab
                if token == eos:  # an end counts where it is among the k best (fairseq's rule)
                    if rank < k and (best[b] is None or value > best[b][1]):
                        best[b] = (prefixes[row], value)
                    continue
                if len(beam_rows) < k:  # once the beam is full, only ends may still count
                    beam_rows.append((row, token, value))
            finished = best[b] is not None and best[b][1] >= max(
                (v for _, _, v in beam_rows), default=-math.inf)
            if finished or not beam_rows:
                continue  # the sequence leaves the batch
            beam_rows += [(beam_rows[0][0], eos, -math.inf)] * (k - len(beam_rows))  # dead rows
            still.append(b)
            for row, token, value in beam_rows:
                rows.append(row)
                new_tokens.append(token)
                new_scores.append(value)
                new_prefixes.append([*prefixes[row], token] if math.isfinite(value) else [])
        if not still:
            active = []
            break
        if len(rows) > SHRINK_AT * len(tokens):  # the rows of ended searches step on
            spare = len(tokens) - len(rows)
            rows, new_tokens = rows + [rows[0]] * spare, new_tokens + [new_tokens[0]] * spare
        decoder.reorder(np.asarray(rows))
        active, tokens = still, np.asarray(new_tokens, dtype=np.int64)
        scores, prefixes = np.asarray(new_scores), new_prefixes
    for j, b in enumerate(active):
        if best[b] is None:
            top = j * k + int(np.argmax(scores[j * k:(j + 1) * k]))
            best[b] = (prefixes[top], float(scores[top]))
    return [found if found is not None else ([], float("-inf")) for found in best]


def best_extensions(total: np.ndarray, count: int) -> np.ndarray:
    """The columns of the ``count`` highest values of each row of ``total``, highest
    first, equal values by column: ``np.argsort(-total, axis=1, kind="stable")[:, :count]``,
    without sorting whole rows (a beam's row is ``beam`` x vocabulary wide, and only its
    first ``count`` are read). Rows where the ``count``-th value has an equal outside the
    ``count`` are ranked by the full stable sort, so ties fall alike.

    >>> best_extensions(np.array([[0.1, 0.5, 0.5, 0.2, 0.5]]), 2)
    array([[1, 2]])
    """
    neg = -total
    if count >= neg.shape[1]:
        return np.argsort(neg, axis=1, kind="stable")
    part = np.argpartition(neg, count - 1, axis=1)[:, :count]
    values = np.take_along_axis(neg, part, axis=1)
    edge = values.max(axis=1, keepdims=True)
    ranked = np.take_along_axis(part, np.lexsort((part, values), axis=-1), axis=1)
    # argpartition keeps any of the values equal to the edge, the stable sort the first
    # columns; a NaN edge counts nothing and is sorted too
    tied = np.flatnonzero((neg <= edge).sum(axis=1) != count)
    if len(tied):
        ranked[tied] = np.argsort(neg[tied], axis=1, kind="stable")[:, :count]
    return ranked


class TableDecoder:
    """A decoder whose next-token log probabilities depend on the last token alone:
    ``table[previous]`` (V, V); it holds no state, so a reorder changes nothing. For the
    examples and tests of the search functions."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float64)

    def step(self, tokens) -> np.ndarray:
        return self.table[np.asarray(tokens, dtype=np.int64)]

    def reorder(self, rows) -> None:
        """Nothing to reorder: the next token depends on the last one alone."""
