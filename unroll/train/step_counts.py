"""What one training step asks of a GPU, counted on the trace device, phase by phase.

The trace backend (``device="trace"``, :mod:`unroll.engine.trace`) runs NumPy in
place of CuPy and records the kernel launches, host syncs and transfers CuPy
would make; the counts are deterministic, so they need no GPU and no idle
machine (docs/design.md, 4. Devices). A training step is the sequence of
:meth:`Solver.step`: the batch's inputs to the device, clear the param diffs,
forward, backward, update (with the solver's non-finite check, if it has one).

A workload here is a callable ``setup(device, **sizes)`` that returns
``(model, solver, feed, tokens)``, as :func:`lstm_setup` does.

>>> from unroll.train import step_counts
>>> counts = step_counts.traced_step(step_counts.lstm_setup, T=3, N=2, D=4, H=5)
>>> counts["forward"].launches > 0, sum(c.syncs for c in counts.values())
(True, 0)
"""

from __future__ import annotations

import numpy as np

from unroll.engine import trace
from unroll.engine.cuda_graph import StepGraphs
from unroll.engine.net import Net
from unroll.frontend.unroller import expand, to_prototxt
from unroll.train.solver import Solver

__all__ = ["PHASES", "count_step", "lstm_setup", "replayed_step", "traced_step"]

PHASES = ("inputs", "clear", "forward", "backward", "update")


def count_step(net, solver: Solver, feed) -> dict[str, trace.Counts]:
    """The counts of each phase (:data:`PHASES`) of one training step of ``net``.

    ``feed`` is the inputs (a dict) or, as :meth:`Solver.step` takes it, a callable
    ``feed(k)`` that makes them (then counted as the "inputs" phase).
    """
    inputs = {}

    def make_inputs():
        inputs.update(feed(solver.iter) if callable(feed) else feed)

    phases = {
        "inputs": make_inputs,
        "clear": net.clear_param_diffs,
        "forward": lambda: net.forward(**inputs),
        "backward": net.backward,
        "update": solver.update,
    }
    counts = {}
    for name, run in phases.items():
        with trace.measure() as counts[name]:
            run()
    return counts


def traced_step(setup, **sizes) -> dict[str, trace.Counts]:
    """The per-phase counts of a workload's second step (the first allocates lazily:
    diffs, the solver's history)."""
    model, solver, feed, _ = setup("trace", **sizes)
    solver.step(1, feed=feed)
    return count_step(model, solver, feed)


def replayed_step(setup, **sizes) -> trace.Counts:
    """The counts of ``solver.step(1)`` with its gradient pass replayed as a CUDA graph
    (:class:`unroll.engine.cuda_graph.StepGraphs`, captured in an earlier step)."""
    model, solver, feed, _ = setup("trace", **sizes)
    solver.graphs = StepGraphs(model, warmup=1)
    solver.step(2, feed=feed)  # one eager pass, then the capture
    with trace.measure() as counts:
        solver.step(1, feed=feed)
    return counts


def lstm_setup(device: str, T: int = 25, N: int = 32, D: int = 100, H: int = 128,
               seed: int = 0):
    """An unrolled LSTM layer (``expand("lstm")``) regressed onto a target by
    EuclideanLoss, on ``device``, with an Adam solver.

    Returns ``(net, solver, inputs, tokens)`` with ``tokens = T * N``; the inputs are
    host arrays, which ``forward`` sends.
    """
    text = to_prototxt(expand("lstm", steps=T, batch=N, input_dim=D, hidden=H)) + f"""
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {H} }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }}
"""
    net = Net(text, device=device, seed=seed)
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.normal(size=(T, N, D)), "cont": (np.arange(T) > 0)[:, None].repeat(N, 1),
              "target": rng.uniform(-1, 1, (T, N, H))}
    return (net, Solver(net, type="Adam", base_lr=1e-3, momentum=0.9, momentum2=0.999),
            inputs, T * N)
