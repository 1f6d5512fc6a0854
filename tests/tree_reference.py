"""Per-node recursive NumPy references of the built-in tree-step templates (float64).

One node at a time, as the equations in the templates read: the level-batched
unrolled nets must equal these (docs/design.md, "Unrolling over trees").
"""

import numpy as np


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def senders(parents, direction):
    """Each node's "children" in run order: its children (up), or its parent (down)."""
    n = len(parents)
    if direction == "down":
        return [[int(parents[j])] if parents[j] >= 0 else [] for j in range(n)]
    return [[k for k in range(n) if parents[k] == j] for j in range(n)]


def child_sum(x, parents, p, direction="up", scope=""):
    """h (n, H) of the child-sum Tree-LSTM over one tree; ``p`` maps param names to arrays."""
    W_iou, b_iou, U_iou = p[f"{scope}W_iou"], p[f"{scope}b_iou"], p[f"{scope}U_iou"]
    W_f, b_f, U_f = p[f"{scope}W_f"], p[f"{scope}b_f"], p[f"{scope}U_f"]
    H = U_f.shape[0]
    kids = senders(parents, direction)
    done = {}

    def node(j):
        if j in done:
            return done[j]
        states = [node(k) for k in kids[j]]
        h_sum = sum((h for h, _ in states), np.zeros(H))
        i, o, u = np.split(W_iou @ x[j] + b_iou + U_iou @ h_sum, 3)
        c = _sigmoid(i) * np.tanh(u)
        for h_k, c_k in states:
            c = c + _sigmoid(W_f @ x[j] + b_f + U_f @ h_k) * c_k
        done[j] = (_sigmoid(o) * np.tanh(c), c)
        return done[j]

    return np.array([node(j)[0] for j in range(len(parents))])


def nary(x, parents, p, arity, direction="up", scope=""):
    """h (n, H) of the N-ary Tree-LSTM over one tree; a node's k-th child in node order
    takes position k (top-down: the parent takes position 0)."""
    W_iou, b_iou, U_iou = p[f"{scope}W_iou"], p[f"{scope}b_iou"], p[f"{scope}U_iou"]
    W_f, b_f, U_f = p[f"{scope}W_f"], p[f"{scope}b_f"], p[f"{scope}U_f"]
    H = W_f.shape[0]
    kids = senders(parents, direction)
    done = {}

    def node(j):
        if j in done:
            return done[j]
        hs, cs = np.zeros((arity, H)), np.zeros((arity, H))
        for pos, k in enumerate(kids[j]):
            hs[pos], cs[pos] = node(k)
        i, o, u = np.split(W_iou @ x[j] + b_iou + U_iou @ hs.reshape(-1), 3)
        f = _sigmoid(np.tile(W_f @ x[j] + b_f, arity) + U_f @ hs.reshape(-1)).reshape(arity, H)
        c = _sigmoid(i) * np.tanh(u) + (f * cs).sum(axis=0)
        done[j] = (_sigmoid(o) * np.tanh(c), c)
        return done[j]

    return np.array([node(j)[0] for j in range(len(parents))])
