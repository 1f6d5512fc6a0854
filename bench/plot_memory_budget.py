"""The memory-budget curve: bytes planned and forward work against T, for each policy.

One LSTM layer under a Euclidean loss at every step (``bench.bench_recompute``'s
net), planned three ways at each T: the full plan, Chen et al.'s square-root
segments (``recompute="sqrt"``) and BPTT-HSM in its fewest slots
(``recompute="hsm"``). Nothing is trained: a plan is a function of the net, so the
figures are the same on every machine. Writes ``bench/figures/memory_budget.json``
and draws ``docs/img/memory_budget.png`` (the Benchmarks page shows both).

    python -m bench.plot_memory_budget
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.bench_recompute import lstm_net

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "bench" / "figures" / "memory_budget.json"
PLOT = ROOT / "docs" / "img" / "memory_budget.png"
POLICIES = {"full plan": None, "sqrt (Chen et al.)": "sqrt", "BPTT-HSM": "hsm"}


def plans(steps, batch: int, hidden: int) -> dict:
    from unroll import Net

    figures = {"batch": batch, "hidden": hidden, "steps": list(steps), "policies": {}}
    for label, policy in POLICIES.items():
        rows = figures["policies"][label] = {"planned_bytes": [], "forward_factor": []}
        for T in steps:
            net = Net(lstm_net(T, batch, hidden, per_step=True), recompute=policy)
            rc = net.inspect().recompute
            rows["planned_bytes"].append(int(rc["planned_bytes"]))
            rows["forward_factor"].append(round(rc["factor"], 3))
    return figures


def draw(figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, work) = plt.subplots(1, 2, figsize=(10, 4))
    for label, rows in figures["policies"].items():
        mem.plot(figures["steps"], [b / 2**20 for b in rows["planned_bytes"]], "o-", label=label)
        work.plot(figures["steps"], rows["forward_factor"], "o-", label=label)
    mem.set(xscale="log", yscale="log", xlabel="T (steps)", ylabel="planned MiB",
            title=f"memory, LSTM N={figures['batch']} H={figures['hidden']}")
    work.set(xscale="log", xlabel="T (steps)", ylabel="forward steps run / one forward",
             title="work (a training step)")
    for ax in (mem, work):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plot_memory_budget",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--plot-only", action="store_true",
                        help="draw the committed figures again, computing nothing")
    args = parser.parse_args(argv)
    if args.plot_only:
        figures = json.loads(FIGURES.read_text())
    else:
        figures = plans(args.steps, args.batch, args.hidden)
        FIGURES.parent.mkdir(parents=True, exist_ok=True)
        FIGURES.write_text(json.dumps(figures, indent=1) + "\n")
    for label, rows in figures["policies"].items():
        print(f"{label:20s} planned KiB "
              + " ".join(f"{b / 1024:9.1f}" for b in rows["planned_bytes"])
              + "   forward x " + " ".join(f"{f:.2f}" for f in rows["forward_factor"]))
    draw(figures, PLOT)
    wrote = [PLOT] if args.plot_only else [FIGURES, PLOT]
    print(f"T = {figures['steps']}; wrote " + " and ".join(str(p.relative_to(ROOT)) for p in wrote))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
