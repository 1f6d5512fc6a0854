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
(:mod:`unroll.engine.cuda_graph`, simulated by the trace backend), and the training
command's own step on packed rows at each row length, eager and with graphs.
The counting is :mod:`unroll.train.step_counts`; the tagger's workloads are
:mod:`examples.pos_tagging.workload`.

    python -m bench.gpu_budget            (from the repository root)
"""

from __future__ import annotations

from examples.pos_tagging.workload import packed_step, tagger_setup
from unroll.engine import trace
from unroll.train.step_counts import PHASES, lstm_setup, replayed_step, traced_step

#: the training command's packed row lengths on EWT
ROW_LENGTHS = (16, 32, 64, 159)


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
    print("the training command's step (packed rows, N=32, its solver), per row length:")
    for T in ROW_LENGTHS:
        eager, graphs = packed_step(T, graphs=False, steps=1), packed_step(T)
        print(f"  T={T:<3}  eager {eager.launches:>5} launches, {eager.syncs} sync, "
              f"{eager.h2d} h2d;  graphs {graphs.launches:>3} launches, {graphs.syncs} sync, "
              f"{graphs.h2d} h2d")


if __name__ == "__main__":
    main()
