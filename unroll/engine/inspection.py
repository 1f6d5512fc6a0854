"""What a built net decided: who owns each param, what runs in place, the splits, the memory.

Caffe hides weight sharing and in-place decisions inside its logs; ``net.inspect()``
(and ``unroll inspect``) puts them in one table a person reads at a glance, and
``as_dict()`` gives the same as data for tools.

>>> import unroll
>>> net = unroll.Net(unroll.expand("rnn", steps=3, batch=2, input_dim=4, hidden=5))
>>> [(p.name, p.owner, p.holders) for p in net.inspect().params]
[('W_xh', 'x_proj_seq', 1), ('b_h', 'x_proj_seq', 1), ('W_hh', 'hh_t0', 3)]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

#: the tables print bytes in KiB
KIB = 1024.0


@dataclass
class ParamInfo:
    """One learnable param: its owner layer, how many layers hold it, and its settings."""

    name: str
    owner: str
    holders: int
    shape: tuple
    count: int
    lr_mult: float
    decay_mult: float
    frozen: bool
    bytes: int


@dataclass
class Inspection:
    """What :func:`inspect_net` found; ``str()`` is the table, :meth:`as_dict` the data."""

    net: str
    params: list[ParamInfo]
    in_place: list[tuple[str, str]]  # (layer, blob) written in place
    out_of_place: list[str]  # in-place tops given memory of their own, with the reason
    splits: list[tuple[str, str, int]]  # (split layer, blob it fans out, readers)
    memory: object  # the net's MemoryReport
    #: param -> layers whose gradients of it backward computes in one GEMM
    batched_gradients: dict
    #: the memory plan's recomputation: ``checkpoints`` (the layer each segment after the
    #: first starts at), ``recomputed_steps``, ``factor`` (forward steps a training step
    #: runs, over those of one forward), ``planned_bytes`` and ``budget`` (None: no plan)
    recompute: dict | None = None

    def as_dict(self) -> dict:
        memory = self.memory
        return {
            "net": self.net,
            "params": [asdict(p) for p in self.params],
            "in_place": [{"layer": layer, "blob": blob} for layer, blob in self.in_place],
            "out_of_place": list(self.out_of_place),
            "splits": [{"layer": name, "blob": blob, "readers": n}
                       for name, blob, n in self.splits],
            "batched_gradients": dict(self.batched_gradients),
            "recompute": None if self.recompute is None else dict(self.recompute),
            "memory": {"params": memory.params, "history": memory.history,
                       "unplanned": memory.unplanned, "planned": memory.planned,
                       "kept": memory.kept, "workspace": memory.workspace},
        }

    def __str__(self) -> str:
        lines = [f"net '{self.net}': {len(self.params)} learnable params, "
                 f"{sum(p.count for p in self.params):,} values"]
        lines.append(f"  {'param':<20} {'owner':<24} {'held by':>7}  {'shape':<14} "
                     f"{'lr':>5} {'decay':>5}  {'KiB':>9}")
        for p in self.params:
            frozen = "  frozen" if p.frozen else ""
            lines.append(f"  {p.name:<20} {p.owner:<24} {p.holders:>7}  {str(p.shape):<14} "
                         f"{p.lr_mult:>5g} {p.decay_mult:>5g}  {p.bytes / KIB:>9.1f}{frozen}")
        lines.append(f"in place: {len(self.in_place)} layer(s)"
                     + (": " + ", ".join(f"{layer} ({blob})" for layer, blob in self.in_place[:8])
                        + (", ..." if len(self.in_place) > 8 else "") if self.in_place else ""))
        lines.append(f"given memory of their own: {len(self.out_of_place)}")
        lines += [f"  {reason}" for reason in self.out_of_place]
        lines.append(f"splits inserted: {len(self.splits)}"
                     + (": " + ", ".join(f"{blob} -> {n}" for _, blob, n in self.splits[:8])
                        + (", ..." if len(self.splits) > 8 else "") if self.splits else ""))
        batched = list(self.batched_gradients.items())
        lines.append(f"param gradients in one GEMM: {len(batched)}"
                     + (": " + ", ".join(f"{name} over {n} layers" for name, n in batched[:8])
                        + (", ..." if len(batched) > 8 else "") if batched else ""))
        recomputed = recompute_line(self.recompute)
        if recomputed is not None:
            lines.append(recomputed)
        m = self.memory
        lines.append(f"memory: params {m.params / KIB:.1f} KiB; activations, diffs and scratch "
                     f"{m.unplanned / KIB:.1f} KiB unplanned, {m.planned / KIB:.1f} KiB planned "
                     f"(kept {m.kept / KIB:.1f} + workspace {m.workspace / KIB:.1f})")
        return "\n".join(lines)


def inspect_net(net) -> Inspection:
    """The decisions ``net`` (a built :class:`~unroll.engine.net.Net`) took; see
    :meth:`Net.inspect`."""
    names = Counter()
    for layer in net.layers:
        for k in range(len(layer.blobs)):
            spec = layer.param.param[k] if k < len(layer.param.param) else None
            names[spec.name if spec is not None and spec.name else f"{layer.name}.{k}"] += 1
    params = [
        ParamInfo(p.name, p.owner, names[p.name], tuple(p.blob.shape), p.blob.count,
                  float(p.lr_mult), float(p.decay_mult), p.lr_mult == 0,
                  int(p.blob.data.nbytes))
        for p in net.learnable_params
    ]
    in_place, splits = [], []
    for step, layer in zip(net.graph.steps, net.layers_run):
        if layer.type == "Split":
            splits.append((layer.name, net.graph.names[step.bottoms[0]], len(step.tops)))
            continue
        in_place += [(layer.name, net.graph.names[t])
                     for t, b in zip(step.tops, step.bottoms) if t == b]
    return Inspection(net.name, params, in_place, list(net.in_place_fallbacks), splits,
                      net.memory_report(), net.batched_param_gradients, recomputation(net))


def recompute_line(rc: dict | None) -> str | None:
    """The table's line on a plan's recomputation ``rc`` (:func:`recomputation`'s), or None
    where there is nothing to say: no plan, or one with neither a budget nor recomputation.

    >>> line = recompute_line({"checkpoints": ["h_t2"], "recomputed_steps": 3, "factor": 1.5,
    ...                        "policy": "one level", "planned_bytes": 2048, "budget": 4096})
    >>> for part in line.split("; "):
    ...     print(part)
    recomputed in backward: 3 steps (forward x 1.50), one level, 2 segments starting at h_t2
    planned 2.0 KiB of a budget of 4.0 KiB
    """
    if rc is None or (rc["budget"] is None and not rc["recomputed_steps"]):
        return None
    shown = ", ".join(rc["checkpoints"][:6]) + (", ..." if len(rc["checkpoints"]) > 6 else "")
    budget = f" of a budget of {rc['budget'] / KIB:.1f} KiB" if rc["budget"] else ""
    return (f"recomputed in backward: {rc['recomputed_steps']} steps (forward x "
            f"{rc['factor']:.2f}), {rc['policy']}, {len(rc['checkpoints']) + 1} segments"
            + (f" starting at {shown}" if shown else "")
            + f"; planned {rc['planned_bytes'] / KIB:.1f} KiB{budget}")


def recomputation(net) -> dict | None:
    """What ``net``'s memory plan recomputes in backward (:attr:`Inspection.recompute`), or
    None where nothing is planned; the memory command's budget line without the rest of
    :func:`inspect_net`.

    >>> import unroll
    >>> net = unroll.Net(unroll.expand("rnn", steps=3, batch=2, input_dim=4, hidden=5))
    >>> recomputation(net)["recomputed_steps"]
    0
    """
    from unroll.engine.memory import input_roots, planned_bytes

    plan, layout = net.memory.liveness, net.memory.layout
    if layout is None:
        return None
    rc, steps = plan.recompute, len(net.layers_run)
    recomputed = rc.recomputed if rc is not None else 0
    return {"checkpoints": [net.layer_names[c] for c in rc.cuts] if rc is not None else [],
            "recomputed_steps": recomputed, "factor": (steps + recomputed) / max(steps, 1),
            "policy": rc.policy if rc is not None else None,
            "planned_bytes": planned_bytes(
                plan, layout, [b.shape for b in net._blob_list], net.dtype.itemsize,
                input_roots(net.graph.steps, net.layers_run, plan.data_root)),
            "budget": net.memory_budget}
