"""Greedy decoding and beam search over a step function, one step of every hypothesis a call.

A decoder is two callables: ``step(tokens)`` takes the last token of each of M
hypotheses, (M,) ints, advances their states one step, and returns the log
probabilities of the next token, (M, V); ``reorder(rows)`` makes hypothesis i
continue the state of hypothesis ``rows[i]``. The lemmatizer's are a
:class:`~unroll.train.stepper.Stepper` over its one-step decoder net
(:class:`~examples.lemmatize.model.StepDecoder`); the tests give hand-made ones.

A hypothesis ends when it emits ``eos`` (which it keeps out of its tokens) or
reaches ``max_len`` tokens; its score is the sum of its tokens' log
probabilities (``eos`` included).
"""

from __future__ import annotations

import numpy as np

__all__ = ["beam_search", "greedy"]


def greedy(step, batch: int, bos: int, eos: int, max_len: int) -> list[tuple[list[int], float]]:
    """The most probable token at every step, for ``batch`` sequences at once: a list of
    (tokens, score) per sequence.

    >>> # p(next | previous) over eos, a, b (and bos, which only starts)
    >>> p = [[1, 0, 0, 0], [.4, .3, .3, 0], [1, 0, 0, 0], [0, .6, .4, 0]]
    >>> table = np.log(np.array(p) + 1e-12)
    >>> [(tokens, round(float(np.exp(score)), 3)) for tokens, score in
    ...  greedy(lambda tokens: table[tokens], batch=1, bos=3, eos=0, max_len=5)]
    [([1], 0.24)]
    """
    tokens = np.full(batch, bos, dtype=np.int64)
    out = [[] for _ in range(batch)]
    scores = np.zeros(batch)
    alive = np.ones(batch, dtype=bool)
    for _ in range(max_len):
        logp = step(tokens)
        tokens = logp.argmax(axis=1)
        scores[alive] += logp[np.flatnonzero(alive), tokens[alive]]
        for i in np.flatnonzero(alive & (tokens != eos)):
            out[i].append(int(tokens[i]))
        alive &= tokens != eos
        if not alive.any():
            break
    return list(zip(out, scores.tolist()))


def beam_search(step, reorder, batch: int, bos: int, eos: int, max_len: int,
                beam: int = 4) -> list[tuple[list[int], float]]:
    """The highest-scoring hypothesis of a beam of ``beam`` for each of ``batch`` sequences:
    a list of (tokens, score). The decoder runs ``batch * beam`` hypotheses, those of
    sequence b in rows ``b * beam ... b * beam + beam - 1``.

    Each step ranks, per sequence, every extension of its live hypotheses: one that ends
    in ``eos`` among the ``beam`` best is finished, and the ``beam`` best that do not end
    make the next beam (so beam 1 is greedy decoding). The search of a sequence
    stops once its best finished score is at least its best live one (scores only fall)
    or at ``max_len``; a sequence with nothing finished then takes its best live one.

    >>> p = [[1, 0, 0, 0], [.4, .3, .3, 0], [1, 0, 0, 0], [0, .6, .4, 0]]
    >>> table = np.log(np.array(p) + 1e-12)
    >>> [(tokens, round(float(np.exp(score)), 3)) for tokens, score in beam_search(
    ...  lambda tokens: table[tokens], lambda rows: None, 1, bos=3, eos=0, max_len=5, beam=2)]
    [([2], 0.4)]
    """
    k = beam
    tokens = np.full(batch * k, bos, dtype=np.int64)
    # every row of a sequence starts alike: only its first may extend at step one
    scores = np.tile(np.r_[0.0, np.full(k - 1, -np.inf)], batch)
    prefixes = [[] for _ in range(batch * k)]
    best: list[tuple[list[int], float] | None] = [None] * batch
    done = np.zeros(batch, dtype=bool)
    for _ in range(max_len):
        logp = step(tokens)
        vocab = logp.shape[1]
        total = (scores[:, None] + logp).reshape(batch, k * vocab)
        rows, new_tokens, new_scores, new_prefixes = [], [], [], []
        for b in range(batch):
            kept = 0
            # the 2k best extensions hold at least k that do not end (or the beam is spent)
            for rank, flat in enumerate(np.argsort(-total[b], kind="stable")[:2 * k]):
                value = total[b, flat]
                row, token = b * k + flat // vocab, int(flat % vocab)
                if done[b] or not np.isfinite(value):
                    break
                if token == eos:  # an end counts where it is among the k best (fairseq's rule)
                    if rank < k and (best[b] is None or value > best[b][1]):
                        best[b] = (prefixes[row], float(value))
                    continue
                if kept == k:  # the beam is full: only ends may still count
                    continue
                rows.append(row)
                new_tokens.append(token)
                new_scores.append(value)
                new_prefixes.append([*prefixes[row], token])
                kept += 1
            for _ in range(kept, k):  # dead rows: never extended again
                rows.append(b * k)
                new_tokens.append(eos)
                new_scores.append(-np.inf)
                new_prefixes.append([])
            live = max(new_scores[-k:])
            if best[b] is not None and best[b][1] >= live:
                done[b] = True
        if done.all():
            break
        reorder(np.asarray(rows))
        tokens = np.asarray(new_tokens, dtype=np.int64)
        scores = np.asarray(new_scores)
        prefixes = new_prefixes
    for b in range(batch):
        if best[b] is None:
            top = b * k + int(np.argmax(scores[b * k:(b + 1) * k]))
            best[b] = (prefixes[top], float(scores[top]))
    return best
