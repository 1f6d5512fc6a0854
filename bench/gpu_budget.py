"""What one training step asks of a GPU: kernel launches, host syncs, transfers, per phase.

Counted on the CPU by the trace backend (``device="trace"``, :mod:`unroll.engine.trace`),
which runs NumPy in place of CuPy and records what CuPy would do; the counts are
deterministic, so they need no GPU and no idle machine. Two workloads:

- the default tagger (:class:`TaggerConfig`'s defaults: word features, the
  character model, two BiLSTM layers), T = 21, N = 32, Adam with clipping at 5
  and the non-finite check, as the training command runs it;
- an LSTM layer (``unroll.expand("lstm")`` + EuclideanLoss), T = 25, N = 32,
  D = 100, H = 128, Adam.

A step is the training command's sequence: the batch's inputs to the device,
clear the param diffs, forward, backward, update (for the tagger, after the
solver's non-finite check, its one read per batch: ``Solver(nonfinite=...)``).
The tagger packs its inputs into one transfer (:meth:`Tagger.inputs`); the
LSTM's inputs are host arrays that ``forward`` sends. Each workload runs one
step first, so that lazy allocations (diffs, solver history) are not counted.

The last lines count a step whose gradient pass is replayed as a CUDA graph
(:mod:`unroll.engine.cuda_graph`, simulated by the trace backend).

    python -m bench.gpu_budget            (from the repository root)
"""

from __future__ import annotations

import numpy as np

from unroll import Net, expand, to_prototxt
from unroll.engine import trace
from unroll.engine.cuda_graph import StepGraphs
from unroll.train.solver import Solver

PHASES = ("inputs", "clear", "forward", "backward", "update")


def count_step(net, solver: Solver, feed) -> dict[str, trace.Counts]:
    """The counts of each phase of one training step.

    ``feed`` is the inputs (a dict) or, as Solver.step takes it, a callable
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


def tagger_setup(device: str, T: int = 21, N: int = 32, seed: int = 0):
    """The default tagger on ``device``, its Adam solver and a synthetic batch of up to T words.

    Returns ``(model, solver, feed, tokens)``: ``feed(k)`` packs the batch and sends it
    to the device, as the training command does; ``tokens`` counts the real (unpadded) words.
    """
    from examples.pos_tagging.conll import UPOS_TAGS
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids

    rng = np.random.default_rng(seed)
    words = [f"{stem}{k}" for stem in ("Word", "run", "x-", "Ab") for k in range(50)]
    lengths = [T] + rng.integers(1, T + 1, N - 1).tolist()
    sentences = [[words[j] for j in rng.integers(0, len(words), n)] for n in lengths]
    tags = [[UPOS_TAGS[j] for j in rng.integers(0, len(UPOS_TAGS), n)] for n in lengths]
    tagger = Tagger(Featurizer.build(sentences), TaggerConfig(batch=N), device=device,
                    seed=seed)
    encoded, labels = tagger.encode(sentences), tag_ids(tags)
    solver = Solver(tagger.train_model, type="Adam", base_lr=2e-3, momentum=0.9,
                    momentum2=0.999, clip_gradients=5.0, nonfinite="skip", max_skipped=0)
    return (tagger.train_model, solver, lambda k: tagger.inputs(encoded, T, labels, train=True),
            sum(lengths))


def lstm_setup(device: str, T: int = 25, N: int = 32, D: int = 100, H: int = 128,
               seed: int = 0):
    """An unrolled LSTM layer regressed onto a target by EuclideanLoss, on ``device``.

    Returns ``(net, solver, inputs, tokens)`` with ``tokens = T * N``.
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
    return net, Solver(net, type="Adam", base_lr=1e-3, momentum=0.9, momentum2=0.999), inputs, T * N


def traced_step(setup, **sizes) -> dict[str, trace.Counts]:
    """The per-phase counts of a workload's second step (the first allocates lazily)."""
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


def table(name: str, counts: dict[str, trace.Counts]) -> str:
    rows = [f"{name}", f"  {'phase':<9} {'launches':>8} {'syncs':>6} {'h2d':>4} {'d2h':>4}"
            f"  top operations / sync sites"]
    total = trace.Counts()
    for phase in PHASES:
        c = counts[phase]
        top = ", ".join(f"{op} {n}" for op, n in c.ops.most_common(4))
        sites = ", ".join(f"{op} {n}" for op, n in c.sync_sites.most_common(3))
        rows.append(f"  {phase:<9} {c.launches:>8} {c.syncs:>6} {c.h2d:>4} {c.d2h:>4}  {top}"
                    + (f" | syncs: {sites}" if sites else ""))
        total.launches += c.launches
        total.syncs += c.syncs
        total.h2d += c.h2d
        total.d2h += c.d2h
    rows.append(f"  {'step':<9} {total.launches:>8} {total.syncs:>6} {total.h2d:>4} "
                f"{total.d2h:>4}")
    return "\n".join(rows)


def main() -> None:
    print(table("default tagger, T=21 N=32 (Adam, clip 5)",
                traced_step(tagger_setup)))
    print(table("LSTM layer, T=25 N=32 D=100 H=128 (Adam)", traced_step(lstm_setup)))
    print("targets for the tagger step: <= 1200 launches, <= 2 syncs, 1 transfer")
    for name, setup in (("tagger", tagger_setup), ("LSTM", lstm_setup)):
        c = replayed_step(setup)
        print(f"{name} solver.step with the gradient pass a CUDA graph (StepGraphs): "
              f"{c.launches} launches ({c.ops['graph.launch']} graph, the rest copies of the "
              f"inputs into its buffers and the update), {c.syncs} sync, {c.h2d} h2d")


if __name__ == "__main__":
    main()
