"""The memory a net may plan, and the error for a net that plans more.

A shape comes from a file (a prototxt, a template's hyper-parameters), and a
dimension of 10**11 is as easy to write as one of 100. A net therefore checks
its memory plan before it allocates anything: its params, the blobs it keeps
and its share of the workspace (:meth:`unroll.engine.net.Net.memory_report` counts
the same) must fit in ``max_bytes``, by default the memory the device has
available now (read with psutil on the host).

>>> import numpy
>>> available_bytes(numpy) > 0
True
>>> print(format_bytes(5 * 2**30), format_bytes(1536))
5.0 GiB 1.5 KiB
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
import psutil

from unroll.core.errors import NetError

__all__ = ["MemoryLimit", "MemoryReport", "available_bytes", "format_bytes", "memory_report",
           "plan_too_big"]


def available_bytes(xp) -> int:
    """Bytes the device of array module ``xp`` can still give: the host's available memory
    (what the OS could hand out without swapping), or a GPU's free memory and CuPy's pool."""
    if xp.__name__ == "cupy":
        free, _ = xp.cuda.runtime.memGetInfo()
        return int(free) + int(xp.get_default_memory_pool().free_bytes())
    return int(psutil.virtual_memory().available)


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def plan_too_big(net: str, need: int, limit: int, given: bool, largest) -> NetError:
    """The error for net ``net`` planning ``need`` bytes over ``limit``.

    ``given`` says whether the limit is the caller's ``max_bytes`` or the memory
    available; ``largest`` lists ``(what, shape, nbytes, layer)`` of the largest
    blobs or params, the likely culprits.

    >>> print(plan_too_big("n", 2**40, 2**30, True, [("blob 'x'", (2**38,), 2**40,
    ...                    "layer 'in' (Input)")]))
    net 'n': the memory plan needs 1.0 TiB, over the limit of 1.0 GiB (max_bytes); largest: \
blob 'x' (274877906944,) 1.0 TiB, of layer 'in' (Input)
    """
    source = ("max_bytes" if given else
              "the memory available; Net(max_bytes=...) sets another limit")
    who = f"net '{net}'" if net else "the net"
    culprits = "; ".join(f"{what} {tuple(shape)} {format_bytes(nbytes)}, of {layer}"
                         for what, shape, nbytes, layer in largest)
    return NetError(f"{who}: the memory plan needs {format_bytes(need)}, over the limit "
                    f"of {format_bytes(limit)} ({source}); largest: {culprits}")


class MemoryLimit:
    """The memory limit of net ``name``: ``max_bytes``, or what the device of ``xp`` has
    available plus what the net already holds of its need (params in ``store``, the
    ``workspace``), checked as each part of the need becomes known."""

    def __init__(self, name: str, max_bytes: int | None, xp, store, workspace):
        self.name, self.max_bytes, self.xp = name, max_bytes, xp
        self.store, self.workspace = store, workspace

    def param_bytes(self) -> int:
        # from the shapes: reading a param's diff would allocate it
        return sum(2 * p.blob.nbytes for p in self.store)

    def bytes(self, held: int = 0) -> int:
        """The limit, where ``held`` bytes of the need (besides params and workspace) are
        allocated already: no longer available, but counted in the need."""
        if self.max_bytes is not None:
            return self.max_bytes
        return available_bytes(self.xp) + self.param_bytes() + self.workspace.nbytes + held

    def _refuse(self, need: int, limit: int, culprits) -> NetError:
        return plan_too_big(self.name, need, limit, self.max_bytes is not None, culprits)

    def check_param(self, nbytes: int, culprit) -> None:
        """Refuse a new param of ``nbytes`` (``culprit``: what, shape, bytes, layer)."""
        have, limit = self.param_bytes(), self.bytes()
        if have + nbytes > limit:
            raise self._refuse(have + nbytes, limit, [culprit])

    def tops_check(self):
        """``check(layer, tops)``: :meth:`check_tops` against :meth:`bytes`, which asks the
        device (psutil: near a millisecond) only once a top is larger than what the net
        holds already (params, workspace), which every top of a net that ran is: each
        reshape of a bucketed model's nets would ask it otherwise."""
        floor = (self.max_bytes if self.max_bytes is not None
                 else self.param_bytes() + self.workspace.nbytes)
        most: list[int] = []

        def check(layer, tops) -> None:
            for top in tops:
                if top.nbytes > floor:
                    if not most:
                        most.append(self.bytes())
                    self.check_tops(layer, tops, most[0])
                    return

        return check

    def check_tops(self, layer, tops, limit: int) -> None:
        """Refuse a top larger than ``limit`` as soon as its shape is known: the layers
        after it could allocate in proportion to it (the whole plan comes later)."""
        for top in tops:
            if top.nbytes > limit:
                raise self._refuse(top.nbytes, limit, [(f"blob '{top.name}'", top.shape,
                                                        top.nbytes,
                                                        f"layer '{layer.name}' ({layer.type})")])

    def check_plan(self, plan, layout, blobs, steps, layers) -> None:
        """Refuse a memory plan (params, kept blobs and workspace) over the limit.

        ``plan`` and ``layout`` are the net's liveness and layout (None: every
        blob is kept, and the layers' scratch is their own); ``blobs`` its blobs
        by number, ``steps`` and ``layers`` its run order.
        """
        kept_roots = [r for r in set(plan.data_root) if r in plan.private]
        kept = sum(blobs[r].nbytes for r in kept_roots)
        kept += sum(blobs[r].nbytes for r in set(plan.diff_root)
                    if r in plan.private and r in plan.diff_life)
        if layout is not None:
            workspace = layout.total
        else:
            workspace = sum(math.prod(shape) * np.dtype(dtype).itemsize for layer in layers
                            for shape, dtype, _ in layer.scratch_specs.values())
        need = self.param_bytes() + kept + workspace
        limit = self.bytes(sum(blobs[r].nbytes for r in kept_roots if blobs[r]._data is not None))
        if need <= limit:
            return
        producer = {}
        for step, layer in zip(steps, layers):
            for b in step.tops:
                producer.setdefault(b, f"layer '{layer.name}' ({layer.type})")
        culprits = [(f"blob '{blobs[r].name}'", blobs[r].shape, blobs[r].nbytes,
                     producer.get(r, "no layer")) for r in set(plan.data_root)]
        culprits += [(f"param '{p.name}'", p.blob.shape, 2 * p.blob.nbytes,
                      f"layer '{p.owner}'") for p in self.store]
        culprits.sort(key=lambda c: -c[2])
        raise self._refuse(need, limit, culprits[:3])


@dataclass
class MemoryReport:
    """Bytes a net needs, planned against unplanned (every blob its own memory).

    ``activations``, ``diffs`` and ``scratch`` are the unplanned sizes;
    ``kept`` is the private part (inputs, outputs, losses, ``keep=``),
    ``workspace`` this net's share of the shared workspace, so ``planned =
    kept + workspace``. ``params`` counts the parameter store (data and diff
    of every param, shared by every net over it), ``history`` the solver's.
    ``largest`` lists ``(blob, shape, bytes, where)`` for the biggest blobs.
    """

    params: int
    history: int
    activations: int
    diffs: int
    scratch: int
    kept: int
    workspace: int
    largest: list

    @property
    def unplanned(self) -> int:
        return self.activations + self.diffs + self.scratch

    @property
    def planned(self) -> int:
        return self.kept + self.workspace

    def __str__(self) -> str:
        kib = 1024.0
        lines = [
            f"params         {self.params / kib:12.1f} KiB",
            f"solver history {self.history / kib:12.1f} KiB",
            f"activations    {self.activations / kib:12.1f} KiB  (unplanned)",
            f"diffs          {self.diffs / kib:12.1f} KiB  (unplanned)",
            f"scratch        {self.scratch / kib:12.1f} KiB  (unplanned)",
            f"unplanned      {self.unplanned / kib:12.1f} KiB",
            f"planned        {self.planned / kib:12.1f} KiB  = kept {self.kept / kib:.1f} "
            f"+ workspace {self.workspace / kib:.1f}",
            "largest blobs:",
        ]
        lines += [f"  {name:<32} {str(shape):<18} {n / kib:10.1f} KiB  {where}"
                  for name, shape, n, where in self.largest]
        return "\n".join(lines)


def memory_report(plan, layout, blobs, layers, params: int, history: int,
                  largest: int) -> MemoryReport:
    """The :class:`MemoryReport` of a net's liveness ``plan`` and ``layout`` (None: nothing
    planned), its ``blobs`` by number and its run order's ``layers``."""
    data_roots, diff_roots, private = set(plan.data_root), set(plan.diff_root), plan.private
    size = {r: blobs[r].nbytes for r in data_roots | diff_roots}  # a root's bytes, once
    diffs_kept = {r for r in diff_roots if r in private and blobs[r]._diff is not None}
    activations = sum(size[r] for r in data_roots)
    diffs = sum(size[r] for r in diff_roots if r in plan.diff_life or r in diffs_kept)
    scratch = sum(math.prod(shape) * np.dtype(dtype).itemsize
                  for layer in layers for shape, dtype, _ in layer.scratch_specs.values())
    kept = (sum(size[r] for r in data_roots if r in private)
            + sum(size[r] for r in diffs_kept))
    if layout is None:
        kept, workspace = activations + diffs + scratch, 0
    else:
        workspace = layout.total
    inside = layout.whole["data"] if layout is not None else None

    def where(r):
        if r in plan.private:
            return "kept"
        return "inside another blob" if inside is not None and inside[r] >= 0 else "workspace"

    big = heapq.nsmallest(largest, sorted(data_roots), key=lambda r: -size[r])
    return MemoryReport(params, history, activations, diffs, scratch, kept, workspace,
                        [(blobs[r].name, blobs[r].shape, blobs[r].nbytes, where(r))
                         for r in big])
