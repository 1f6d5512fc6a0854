"""The bidirectional child-sum Tree-LSTM of ``bench/bench_trees.py`` as PyTorch users write
it, trained on the same batches: nodes per second of forward, backward and an Adam step.

Two versions of the same equations (Tai et al. 2015, section 3.1, as
``unroll/frontend/templates/child_sum_tree_lstm.prototxt.j2`` has them; top-down,
a node's one "child" is its parent):

- ``recursive``: an ``nn.Module`` that recurses over each tree, one node at a
  time (the way most Tree-LSTM code is written);
- ``batched``: every node of one level of the batch at once (height bottom-up,
  depth top-down): the input projections of all nodes in one product, the
  children's states gathered by index, the child sums by ``index_add``.

The batches come from ``python -m bench.bench_trees --plan PLAN`` (its timed
epoch: the same trees in the same batches); the level indices of each batch are
made before the clock starts, as that side's inputs are. A first pass over the
batches warms up; ``--repeat`` more are timed (the median, and the fastest).
One thread, as the other side has.
``--check DUMP`` (from ``bench_trees --dump``) instead loads that side's
weights and inputs and prints how far each version's h, and the gradients of the
loss, are from that side's (float64).
Needs torch (not a dependency of unroll): run it with a Python that has it.

    python -m bench.bench_trees --plan plan.json
    python bench/bench_trees_torch.py plan.json --version batched    (torch installed)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import numpy as np
import torch
from torch import nn

DIRECTIONS = ("up", "down")


def children_of(parents) -> list[list[int]]:
    kids = [[] for _ in parents]
    for k, p in enumerate(parents):
        if p >= 0:
            kids[p].append(k)
    return kids


class Cell(nn.Module):
    """One direction's weights: W (input, with the biases) and U (hidden state)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.W_iou = nn.Linear(dim, 3 * hidden)
        self.U_iou = nn.Linear(hidden, 3 * hidden, bias=False)
        self.W_f = nn.Linear(dim, hidden)
        self.U_f = nn.Linear(hidden, hidden, bias=False)

    def node(self, x, child_h, child_c):
        """One node: x (D,), its children's states (k, H) each; k = 0 for a leaf."""
        i, o, u = (self.W_iou(x) + self.U_iou(child_h.sum(0))).chunk(3)
        c = torch.sigmoid(i) * torch.tanh(u)
        if child_h.shape[0]:
            f = torch.sigmoid(self.W_f(x) + self.U_f(child_h))
            c = c + (f * child_c).sum(0)
        return torch.sigmoid(o) * torch.tanh(c), c


class RecursiveTreeLSTM(nn.Module):
    """Bidirectional child-sum Tree-LSTM, one node at a time by recursion over each tree."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = Cell(dim, hidden), Cell(dim, hidden)

    def forward(self, x, parents):
        """h (n, 2H) of one tree: x (n, D), parents[i] of node i (-1: the root)."""
        kids = children_of(parents)
        none = x.new_zeros(0, self.up.hidden)
        up: dict = {}

        def bottom_up(j):
            states = [bottom_up(k) for k in kids[j]]
            hs = torch.stack([h for h, _ in states]) if states else none
            cs = torch.stack([c for _, c in states]) if states else none
            up[j] = self.up.node(x[j], hs, cs)
            return up[j]

        down: dict = {}

        def top_down(j, h_parent, c_parent):
            down[j] = self.down.node(x[j], h_parent, c_parent)
            for k in kids[j]:
                top_down(k, down[j][0][None], down[j][1][None])

        root = parents.index(-1)
        bottom_up(root)
        top_down(root, none, none)
        return torch.stack([torch.cat([up[j][0], down[j][0]]) for j in range(len(parents))])


def level_plan(parents, direction: str) -> list[dict]:
    """Per level of a batch (concatenated parents, -1 for roots): the index tensors."""
    n = len(parents)
    p = np.asarray(parents)
    if direction == "up":
        level = np.zeros(n, np.int64)
        kids = children_of(parents)
        order = np.argsort(-_depths(p), kind="stable")
        for j in order.tolist():
            for k in kids[j]:
                level[j] = max(level[j], level[k] + 1)
    else:
        level = _depths(p)
    out = []
    for lv in range(int(level.max()) + 1):
        nodes = np.flatnonzero(level == lv)
        where = np.full(n, -1, np.int64)
        where[nodes] = np.arange(nodes.size)
        if direction == "up":  # every child of a node of this level, and its parent's slot
            senders = np.flatnonzero((p >= 0) & (level[np.maximum(p, 0)] == lv))
            slot = where[p[senders]]
        else:  # every non-root node of this level reads its parent
            senders = p[nodes[p[nodes] >= 0]]
            slot = np.flatnonzero(p[nodes] >= 0)
        out.append({name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in
                    (("nodes", nodes), ("senders", senders), ("slot", slot),
                     ("receivers", nodes[slot]))})
    return out


def _depths(p: np.ndarray) -> np.ndarray:
    depth = np.full(p.size, -1, np.int64)
    depth[p < 0] = 0
    while (depth < 0).any():
        ready = (depth < 0) & (depth[np.maximum(p, 0)] >= 0)
        depth[ready] = depth[p[ready]] + 1
    return depth


class BatchedTreeLSTM(nn.Module):
    """Bidirectional child-sum Tree-LSTM over a batch of trees, one level at a time."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = Cell(dim, hidden), Cell(dim, hidden)

    def direction(self, cell: Cell, x, levels):
        n, hidden = x.shape[0], cell.hidden
        iou_x, f_x = cell.W_iou(x), cell.W_f(x)
        # states written level by level: a level reads only rows written before it
        h, c = x.new_zeros(n, hidden), x.new_zeros(n, hidden)
        for lv in levels:
            nodes, senders, slot = lv["nodes"], lv["senders"], lv["slot"]
            iou = iou_x[nodes]
            c_new = None
            if senders.numel():
                h_k, c_k = h[senders], c[senders]
                h_sum = x.new_zeros(nodes.numel(), hidden).index_add_(0, slot, h_k)
                iou = iou + cell.U_iou(h_sum)
                f = torch.sigmoid(f_x[lv["receivers"]] + cell.U_f(h_k))
                c_new = x.new_zeros(nodes.numel(), hidden).index_add_(0, slot, f * c_k)
            i, o, u = iou.chunk(3, dim=1)
            c_l = torch.sigmoid(i) * torch.tanh(u)
            if c_new is not None:
                c_l = c_l + c_new
            h.index_copy_(0, nodes, torch.sigmoid(o) * torch.tanh(c_l))
            c.index_copy_(0, nodes, c_l)
        return h

    def forward(self, x, plan):
        """h (n, 2H) of the batch: x (n, D), plan: {direction: level_plan(...)}."""
        return torch.cat([self.direction(self.up, x, plan["up"]),
                          self.direction(self.down, x, plan["down"])], dim=1)


def offsets_parents(trees) -> list[int]:
    out, start = [], 0
    for t in trees:
        out += [q + start if q >= 0 else -1 for q in t]
        start += len(t)
    return out


def train(version: str, batches, dim: int, hidden: int, repeat: int) -> tuple[float, float]:
    """Nodes/s of the median and of the fastest of ``repeat`` timed passes."""
    torch.manual_seed(0)
    model = (RecursiveTreeLSTM if version == "recursive" else BatchedTreeLSTM)(dim, hidden)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    gen = torch.Generator().manual_seed(0)
    prepared = []
    for trees in batches:
        n = sum(len(t) for t in trees)
        x = torch.randn(n, dim, generator=gen)
        if version == "recursive":
            starts = np.cumsum([0] + [len(t) for t in trees]).tolist()
            prepared.append((x, [(t, starts[k]) for k, t in enumerate(trees)]))
        else:
            parents = offsets_parents(trees)
            prepared.append((x, {d: level_plan(parents, d) for d in DIRECTIONS}))

    def epoch():
        for x, plan in prepared:
            opt.zero_grad()
            if version == "recursive":
                h = torch.cat([model(x[s: s + len(t)], t) for t, s in plan])
            else:
                h = model(x, plan)
            loss = (h * h).sum() / (2 * h.shape[0])  # Caffe's EuclideanLoss, target 0
            loss.backward()
            opt.step()

    epoch()
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        epoch()
        seconds.append(time.perf_counter() - start)
    nodes = sum(len(t) for b in batches for t in b)
    return nodes / statistics.median(seconds), nodes / min(seconds)


def check(path: str) -> None:
    """How far each version's h is from bench_trees' h on its dump (float64)."""
    d = np.load(path)
    x = torch.from_numpy(d["x"])
    dim, hidden = x.shape[1], d["up_U_f"].shape[0]
    sizes = d["sizes"].tolist()
    starts = np.cumsum([0] + sizes).tolist()
    trees = [d["parents"][starts[k]: starts[k + 1]].tolist() for k in range(len(sizes))]
    want = torch.from_numpy(d["h"])
    for cls in (RecursiveTreeLSTM, BatchedTreeLSTM):
        model = cls(dim, hidden).double()
        with torch.no_grad():
            for name, param in unroll_names(model):
                param.copy_(torch.from_numpy(d[name]))
        if cls is RecursiveTreeLSTM:
            got = torch.cat([model(x[s: s + n], t) for t, s, n in zip(trees, starts, sizes)])
        else:
            parents = offsets_parents(trees)
            got = model(x, {dr: level_plan(parents, dr) for dr in DIRECTIONS})
        ((got * got).sum() / (2 * got.shape[0])).backward()
        grad = max((p.grad - torch.from_numpy(d[f"grad_{name}"])).abs().max().item()
                   for name, p in unroll_names(model))
        largest = max(np.abs(d[f"grad_{name}"]).max() for name, _ in unroll_names(model))
        print(f"{cls.__name__}: {len(trees)} trees, {x.shape[0]} nodes, max |h - unroll's h| = "
              f"{(got - want).abs().max().item():.2e} (|h| up to {want.abs().max().item():.2f}), "
              f"max |gradient - unroll's| = {grad:.2e} (up to {largest:.2e})")


def unroll_names(model):
    """(unroll's param name, the torch param) of every weight and bias."""
    for name, cell in (("up", model.up), ("down", model.down)):
        for w in ("W_iou", "U_iou", "W_f", "U_f"):
            yield f"{name}_{w}", getattr(cell, w).weight
        for b in ("iou", "f"):
            yield f"{name}_b_{b}", getattr(cell, f"W_{b}").bias


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plan", nargs="?", help="bench_trees --plan's file")
    parser.add_argument("--version", choices=["recursive", "batched"], default="batched")
    parser.add_argument("--trees", type=int, default=0,
                        help="only the first batches holding this many trees (0: all)")
    parser.add_argument("--repeat", type=int, default=5, help="timed passes")
    parser.add_argument("--check", metavar="DUMP", help="compare with bench_trees --dump's h")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.check:
        check(args.check)
        return
    if not args.plan:
        parser.error("give the plan (python -m bench.bench_trees --plan FILE) or --check DUMP")
    plan = json.loads(open(args.plan).read())
    batches = plan["batches"]
    if args.trees:
        kept, count = [], 0
        for b in batches:
            if count >= args.trees:
                break
            kept.append(b)
            count += len(b)
        batches = kept
    rate, best = train(args.version, batches, plan["dim"], plan["hidden"], args.repeat)
    trees = sum(len(b) for b in batches)
    print(f"PyTorch {torch.__version__} {args.version}: {rate:,.0f} nodes/s (fastest pass "
          f"{best:,.0f}; train: forward, backward, Adam) over {trees} trees in {len(batches)} "
          f"batches; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
