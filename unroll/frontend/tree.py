"""Trees for the tree unroller: structure, validation, and the level-by-level layout of a batch.

A :class:`Tree` is a rooted tree over nodes ``0 .. n-1``, given by each node's
parent (``-1`` for the root), or by CoNLL-U heads (1-based, ``0`` for the root)
with :meth:`Tree.from_heads`. A bad tree (several roots, none, a head out of
range, a cycle) is a :class:`~unroll.core.errors.TreeError` naming the node.

A batch of trees runs level by level (``docs/design.md``, "Unrolling over
trees"): bottom-up, each node one level below its parent, the tree's height
less its depth (the deepest leaves first, the root last); top-down, the nodes
of depth ``l`` (roots first). Either way every child is in the level next to
its parent's, so a level reads only the level before it, and a tree's levels
cost what its nodes do, however deep it is. Each level is one batched step.
A tree has at most :data:`MAX_TREE_NODES` nodes and :data:`MAX_TREE_DEPTH`
levels. :class:`TreeLayout` places a batch's nodes into level slots of given
widths (the bucket's, at least the real ones) and makes the index inputs that
wire children to parents, so that the unrolled net depends only on the widths.

>>> t = Tree.from_heads([2, 0, 2])          # "a b c": b is the root, a and c its children
>>> t.parents.tolist(), t.heights().tolist(), t.depths().tolist()
([1, -1, 1], [0, 1, 0], [1, 0, 1])
>>> level_widths([t], "up"), level_widths([t], "down")
((2, 1), (1, 2))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from unroll.core.errors import TreeError

__all__ = ["DIRECTIONS", "MAX_TREE_DEPTH", "MAX_TREE_NODES", "Tree", "TreeLayout",
           "level_widths", "levels_of"]

#: "up": leaves to root, each node a level below its parent; "down": root to leaves, levels
#: by depth
DIRECTIONS = ("up", "down")
#: the most nodes of one tree (a sentence of 10,000 words)
MAX_TREE_NODES = 10_000
#: the most levels of one tree: its height (the longest path from the root) plus one
MAX_TREE_DEPTH = 10_000


class Tree:
    """A rooted tree: ``parents[i]`` is node i's parent, -1 for the one root.

    ``where`` names the tree in errors (a file and line, say). Children are
    kept in node order; a node's ``position`` is its rank among its siblings
    (the N-ary Tree-LSTM's child slot).

    >>> Tree([1, -1, 1, 2]).children(1), Tree([1, -1, 1, 2]).positions().tolist()
    ([0, 2], [0, 0, 1, 0])
    >>> Tree([1, 0])
    Traceback (most recent call last):
    unroll.core.errors.TreeError: tree: no root (every node has a parent); a tree needs one node \
with parent -1
    """

    def __init__(self, parents: Sequence[int], where: str = "tree"):
        self.where = where
        p = np.asarray(parents)
        if p.ndim != 1 or p.size == 0:
            raise TreeError(f"{where}: a tree needs at least one node, found parents of shape "
                            f"{p.shape}")
        if not np.issubdtype(p.dtype, np.integer):
            raise TreeError(f"{where}: parents must be integers, found dtype {p.dtype}")
        if p.size > MAX_TREE_NODES:
            raise TreeError(f"{where}: {p.size} nodes; a tree has at most {MAX_TREE_NODES} "
                            f"(unroll.frontend.tree.MAX_TREE_NODES)")
        self.parents = p.astype(np.int64)
        self._check()

    @classmethod
    def from_heads(cls, heads: Sequence[int], where: str = "tree") -> Tree:
        """The tree of CoNLL-U heads: ``heads[i]`` is word i+1's head, 0 for the root.

        >>> Tree.from_heads([0, 1, 1]).parents.tolist()
        [-1, 0, 0]
        >>> Tree.from_heads([0, 1.5])
        Traceback (most recent call last):
        unroll.core.errors.TreeError: tree: word 2's head is 1.5, not an integer
        """
        for i, head in enumerate(heads, start=1):
            if isinstance(head, bool) or not isinstance(head, (int, np.integer)):
                raise TreeError(f"{where}: word {i}'s head is {head!r}, not an integer")
        return cls(np.asarray(heads, dtype=np.int64) - 1, where)

    def __len__(self) -> int:
        return int(self.parents.size)

    def __repr__(self) -> str:
        return f"Tree({len(self)} nodes, height {int(self.heights().max())})"

    def _check(self) -> None:
        p, n = self.parents, len(self.parents)
        bad = np.flatnonzero((p < -1) | (p >= n))
        if bad.size:
            i = int(bad[0])
            raise TreeError(f"{self.where}: node {i} has parent {int(p[i])}, outside -1..{n - 1} "
                            f"(as a CoNLL-U head: {int(p[i]) + 1}, outside 0..{n})")
        roots = np.flatnonzero(p == -1)
        if roots.size == 0:
            raise TreeError(f"{self.where}: no root (every node has a parent); a tree needs one "
                            f"node with parent -1")
        if roots.size > 1:
            raise TreeError(f"{self.where}: several roots, nodes {roots.tolist()[:5]} (CoNLL-U "
                            f"head 0); a tree has exactly one")
        self.root = int(roots[0])
        depth = self._depths()
        if (depth < 0).any():
            i = int(np.flatnonzero(depth < 0)[0])
            cycle, j = [i], int(p[i])
            while j != i:
                cycle.append(j)
                j = int(p[j])
            raise TreeError(f"{self.where}: nodes {cycle} form a cycle (each is the parent of "
                            f"the one before); they never reach the root {self.root}")
        if depth.max() >= MAX_TREE_DEPTH:
            raise TreeError(f"{self.where}: {int(depth.max()) + 1} levels (the longest path "
                            f"from the root); a tree has at most {MAX_TREE_DEPTH} "
                            f"(unroll.frontend.tree.MAX_TREE_DEPTH)")
        self._depth = depth

    def _depths(self) -> np.ndarray:
        """Depth of every node, -1 for a node that never reaches the root (on a cycle)."""
        p, n = self.parents, len(self.parents)
        depth = np.full(n, -1, np.int64)
        depth[self.root] = 0
        # pointer doubling would be faster; trees here are sentences
        for i in range(n):
            path, j = [], i
            while depth[j] < 0 and len(path) <= n:
                path.append(j)
                j = int(p[j])
                if j < 0:
                    break
            if j >= 0 and depth[j] >= 0:
                for k, node in enumerate(reversed(path), start=1):
                    depth[node] = depth[j] + k
        return depth

    def depths(self) -> np.ndarray:
        """Each node's distance from the root (the root: 0)."""
        return self._depth.copy()

    def heights(self) -> np.ndarray:
        """Each node's distance to its deepest leaf (a leaf: 0)."""
        height = np.zeros(len(self), np.int64)
        for i in np.argsort(-self._depth, kind="stable").tolist():
            j = int(self.parents[i])
            if j >= 0:
                height[j] = max(height[j], height[i] + 1)
        return height

    def children(self, i: int) -> list[int]:
        """Node ``i``'s children, in node order."""
        return np.flatnonzero(self.parents == i).tolist()

    def positions(self) -> np.ndarray:
        """Each node's rank among its parent's children (the root: 0)."""
        pos = np.zeros(len(self), np.int64)
        seen: dict[int, int] = {}
        for i, j in enumerate(self.parents.tolist()):
            if j >= 0:
                pos[i] = seen.get(j, 0)
                seen[j] = pos[i] + 1
        return pos

    def arity(self) -> int:
        """The most children any node has."""
        return int(np.bincount(self.parents[self.parents >= 0], minlength=1).max())


def levels_of(tree: Tree, direction: str) -> np.ndarray:
    """Each node's level: the tree's height less its depth (``"up"``: a node one level
    below its parent, the root last), or its depth (``"down"``).

    >>> levels_of(Tree.from_heads([0, 1, 2, 1]), "up").tolist()
    [2, 1, 0, 1]
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, found {direction!r}")
    depths = tree.depths()
    return depths.max() - depths if direction == "up" else depths


def level_widths(trees: Sequence[Tree], direction: str) -> tuple[int, ...]:
    """Nodes per level over the batch ``trees``: level 0 first."""
    counts = [np.bincount(levels_of(t, direction)) for t in trees]
    out = np.zeros(max(c.size for c in counts), np.int64)
    for c in counts:
        out[: c.size] += c
    return tuple(int(w) for w in out)


@dataclass
class TreeLayout:
    """A batch of trees placed in level slots of ``widths``, and the inputs that wire it.

    Nodes are rows ``0 .. M-1`` of the node-order tables (``x`` in, ``h``
    out): tree 0's nodes first, then tree 1's, then padding rows up to
    ``rows``. Level ``l`` has ``widths[l]`` slots, the batch's nodes of that
    level first (in row order), then padding slots; slots are numbered level
    after level. :meth:`inputs` gives the index arrays the unrolled net reads
    (see :mod:`unroll.frontend.tree_unroller` for what each one is).

    >>> layout = TreeLayout.of([Tree([-1, 0, 0])], "up", widths=(3, 1), rows=4)
    >>> layout.slot_node.tolist(), layout.node_slot.tolist()
    ([1, 2, 3, 0], [3, 0, 1, 2])
    """

    trees: list
    direction: str
    widths: tuple
    rows: int
    slot_node: np.ndarray  # slot -> node row
    node_slot: np.ndarray  # node row -> slot
    parent_row: np.ndarray  # node row -> its parent's row (-1: root or padding)
    position: np.ndarray  # node row -> rank among its siblings
    level: np.ndarray  # node row -> level (-1: padding)

    @classmethod
    def of(cls, trees: Sequence[Tree], direction: str, widths: Sequence[int] | None = None,
           rows: int | None = None) -> TreeLayout:
        trees = list(trees)
        if not trees:
            raise ValueError("a tree batch needs at least one tree")
        real = level_widths(trees, direction)
        widths = real if widths is None else tuple(int(w) for w in widths)
        if len(widths) != len(real) or any(w < r for w, r in zip(widths, real)):
            raise ValueError(f"level widths {widths} do not hold the batch's {real} ({direction}: "
                             f"one width per level, each at least the batch's)")
        n = sum(len(t) for t in trees)
        rows = max(n, sum(widths)) if rows is None else int(rows)
        if rows < max(n, sum(widths)):
            raise ValueError(f"rows {rows} do not hold {n} nodes and {sum(widths)} slots")
        parent_row = np.full(rows, -1, np.int64)
        position = np.zeros(rows, np.int64)
        level = np.full(rows, -1, np.int64)
        start = 0
        for t in trees:
            end = start + len(t)
            parent_row[start:end] = np.where(t.parents >= 0, t.parents + start, -1)
            position[start:end] = t.positions()
            level[start:end] = levels_of(t, direction)
            start = end
        offsets = np.concatenate(([0], np.cumsum(widths)))
        slot_node = np.empty(sum(widths), np.int64)
        node_slot = np.empty(rows, np.int64)
        pad_rows = iter(range(n, rows))
        for lv, w in enumerate(widths):
            members = np.flatnonzero(level == lv)
            slots = np.arange(offsets[lv], offsets[lv] + w)
            slot_node[slots[: members.size]] = members
            node_slot[members] = slots[: members.size]
            # padding slots read padding rows, so every real row is read by one slot only
            for s in slots[members.size:].tolist():
                r = next(pad_rows)
                slot_node[s], node_slot[r] = r, s
        for r in pad_rows:  # rows beyond the slots: read any slot, their outputs are padding
            node_slot[r] = 0
        return cls(trees, direction, widths, rows, slot_node, node_slot, parent_row, position,
                   level)

    def _rows_by_level(self) -> list:
        """The real node rows of each level, in row order."""
        real = np.flatnonzero(self.level >= 0)
        ordered = real[np.argsort(self.level[real], kind="stable")]
        ends = np.searchsorted(self.level[ordered], np.arange(len(self.widths)), side="right")
        return np.split(ordered, ends[:-1])

    @property
    def nodes(self) -> int:
        """Real nodes in the batch."""
        return int((self.level >= 0).sum())

    @property
    def padding_fraction(self) -> float:
        """Padding slots / all slots."""
        return 1.0 - self.nodes / sum(self.widths)

    def inputs(self, scope: str = "", children: str = "sum", arity: int | None = None) -> dict:
        """The index inputs of one direction of a tree net expanded with these widths.

        ``children`` and ``arity`` are the template's and the expansion's (see
        :func:`unroll.frontend.tree_unroller.expand_tree`); ``scope`` the direction's prefix.
        """
        offsets = np.concatenate(([0], np.cumsum(self.widths)))
        out = {f"{scope}slot_node": self.slot_node.astype(float),
               f"{scope}node_slot": self.node_slot.astype(float)}
        by_level = self._rows_by_level()
        for lv, w in enumerate(self.widths):
            members = by_level[lv]
            # every child is in the level next to its parent's: a level's table is a zero
            # row, then the level before it (below bottom-up, above top-down)
            before = offsets[lv - 1] if lv else 0
            if children == "positional" or (self.direction == "down" and children == "sum"):
                per = 1 if children == "sum" else int(arity)
                src = np.zeros((w, per), np.int64)
                if self.direction == "down":
                    # the parent at position 0
                    for k, r in enumerate(members.tolist()):
                        p = self.parent_row[r]
                        src[k, 0] = 0 if p < 0 else 1 + self.node_slot[p] - before
                else:
                    for r in (by_level[lv - 1] if lv else ()):
                        p = self.parent_row[r]
                        if p < 0:  # a shallower tree's root
                            continue
                        _check_arity(self, r, per)
                        src[self.node_slot[p] - offsets[lv], self.position[r]] = (
                            1 + self.node_slot[r] - before)
                out[f"{scope}src_{lv}"] = src.reshape(-1).astype(float)
                continue
            # children "sum", bottom-up: every row of the message table (a zero row, then
            # the level below) goes to its parent's slot in this level, or nowhere (-1)
            table = np.concatenate(([-1], self.slot_node[before: offsets[lv]]))
            if arity is None:
                seg = np.full(table.size, -1, np.int64)
                for k, r in enumerate(table.tolist()):
                    p = self.parent_row[r] if r >= 0 else -1
                    if p >= 0 and self.level[p] == lv:
                        seg[k] = self.node_slot[p] - offsets[lv]
                out[f"{scope}seg_{lv}"] = seg.astype(float)
            else:
                # the fixed-arity form: slot j's a-th child is table row src[a, j] (0: none)
                src = np.zeros((int(arity), w), np.int64)
                for k, r in enumerate(table.tolist()):
                    p = self.parent_row[r] if r >= 0 else -1
                    if p >= 0 and self.level[p] == lv:
                        _check_arity(self, r, int(arity))
                        src[self.position[r], self.node_slot[p] - offsets[lv]] = k
                out[f"{scope}src_{lv}"] = src.reshape(-1).astype(float)
            # the receivers: each slot's parent row, for the edge's s.receiver inputs
            parents = self.parent_row[self.slot_node[offsets[lv]: offsets[lv + 1]]]
            out[f"{scope}parent_{lv}"] = np.maximum(parents, 0).astype(float)
        return out


def _check_arity(layout: TreeLayout, row: int, arity: int) -> None:
    """Node ``row`` fits one of its parent's ``arity`` child slots."""
    if layout.position[row] < arity:
        return
    start = 0
    for t in layout.trees:
        if row < start + len(t):
            raise TreeError(f"{t.where}: node {layout.parent_row[row] - start} has more than "
                            f"{arity} children, but the net was expanded with arity {arity}")
        start += len(t)
