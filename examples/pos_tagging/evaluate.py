"""UPOS accuracy, per-tag precision / recall / F1 and the most frequent confusions."""

from __future__ import annotations

from collections import Counter

import numpy as np

from unroll.tools.conllu import UPOS_TAGS


def score(gold: list, predicted: list) -> dict:
    """Scores of predicted against gold tag-id arrays (one per sentence).

    >>> r = score([np.array([0, 1, 1])], [np.array([0, 1, 0])])
    >>> round(r["accuracy"], 3), r["tokens"], r["confusions"][0]
    (0.667, 3, ('ADP', 'ADJ', 1))
    """
    g = np.concatenate(gold) if gold else np.zeros(0, int)
    p = np.concatenate(predicted) if predicted else np.zeros(0, int)
    if g.shape != p.shape:
        raise ValueError(f"{g.size} gold tags but {p.size} predicted")
    n = len(UPOS_TAGS)
    confusion = np.bincount(g * n + p, minlength=n * n).reshape(n, n)
    per_tag = {}
    for k, tag in enumerate(UPOS_TAGS):
        tp = int(confusion[k, k])
        gold_k, pred_k = int(confusion[k].sum()), int(confusion[:, k].sum())
        precision = tp / pred_k if pred_k else 0.0
        recall = tp / gold_k if gold_k else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_tag[tag] = {"precision": precision, "recall": recall, "f1": f1, "support": gold_k}
    errors = Counter()
    for i, j in zip(*np.nonzero(confusion)):
        if i != j:
            errors[(UPOS_TAGS[i], UPOS_TAGS[j])] = int(confusion[i, j])
    return {
        "accuracy": float(np.trace(confusion) / max(g.size, 1)),
        "tokens": int(g.size),
        "per_tag": per_tag,
        "confusions": [(gt, pt, c) for (gt, pt), c in errors.most_common(10)],
    }


def report(result: dict) -> str:
    """The scores as a table a person reads."""
    lines = [f"UPOS accuracy: {100 * result['accuracy']:.2f}% of {result['tokens']} tokens", ""]
    lines.append(f"{'tag':<6} {'prec':>6} {'rec':>6} {'f1':>6} {'support':>8}")
    for tag, r in result["per_tag"].items():
        if r["support"] or r["precision"]:
            lines.append(f"{tag:<6} {100 * r['precision']:6.2f} {100 * r['recall']:6.2f} "
                         f"{100 * r['f1']:6.2f} {r['support']:8d}")
    lines += ["", "most frequent confusions (gold -> predicted: count):"]
    lines += [f"  {g:>5} -> {p:<5} {c}" for g, p, c in result["confusions"]]
    return "\n".join(lines)
