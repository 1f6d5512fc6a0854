"""How long the front half of planning takes: ``unroll.expand``, ``Net()`` without a budget, and
``unroll memory --budget`` for the char LM.

Prints, for one LSTM layer (N=32, H=256) at T = 1,000, 5,000 and 20,000 (``--steps``):
the seconds of ``expand`` (rendering, renaming, the check that builds its net) and of
``Net()`` with no budget of the net ``bench_recompute`` plans its budgets for (that
layer with a Euclidean loss at every step); then the seconds of ``unroll memory
--budget`` (half the full plan; ``--charlm-budget``) for the char LM's net at T=2000
(N=32, H=256, 132 symbols, one SoftmaxWithLoss over the whole output), the whole
command in a process of its own, its prototxt written first. ``--clock cpu``
(the default) counts CPU seconds, which a busy machine disturbs less than the wall
clock; each figure is the least of ``--repeat`` runs. For the tagger's nets and
other templates, ``--cases``.

It measures the checkout it runs in: for a before and after, run it in both, e.g.
from a checkout of an older commit ``PYTHONPATH=. python <this checkout>/bench/bench_expand.py``.

    python -m bench.bench_expand                       (from the repository root)
    python -m bench.bench_expand --steps 20000 --repeat 1
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the tagger example's nets: TaggerConfig's defaults over EWT-sized vocabularies
TAGGER = dict(batch=32, vocab=20000, tags=17, embed=100, hidden=256, layers=2, cell="lstm",
              chars={"embed": 32, "hidden": 64, "length": 16, "vocab": 100}, char_columns=32,
              ignore_label=-1)
CASES = {
    **{f"tagger T={T}": ("tagger", dict(steps=T, **TAGGER)) for T in (16, 32, 64, 159)},
    "small tagger T=2000": ("tagger", dict(steps=2000, batch=2, vocab=7, tags=3, layers=2,
                                           hidden=4)),
}


def clock(kind: str):
    return time.process_time if kind == "cpu" else time.perf_counter


def least(run, repeat: int, now) -> float:
    """The least seconds of ``repeat`` calls of ``run``."""
    best = float("inf")
    for _ in range(repeat):
        start = now()
        run()
        best = min(best, now() - start)
    return best


def lstm_expand(T: int):
    """The LSTM layer's net (N=32, H=256), expanded anew (not from expand's cache)."""
    from unroll import expand
    from unroll.frontend import unroller

    unroller._EXPANDED.clear()
    return expand("lstm", steps=T, batch=32, input_dim=256, hidden=256)


def lstm_figures(args, now) -> None:
    from bench.bench_recompute import lstm_net
    from unroll import Net

    Net(lstm_net(40, 32, 256, per_step=True))  # imports and compiled kernels: not the figures'
    for T in args.steps:
        expand = least(lambda T=T: lstm_expand(T), args.repeat, now)
        net_param = lstm_net(T, 32, 256, per_step=True)
        build = least(lambda net_param=net_param: Net(net_param), args.repeat, now)
        print(f"LSTM T={T}: expand {expand:.2f} s, Net() without a budget {build:.2f} s "
              f"({len(net_param.layer):,} layers with a loss at every step)", flush=True)


def charlm_figures(args) -> None:
    """The seconds of ``unroll memory --budget`` for the char LM at T=2000, its own process."""
    from examples.charlm.model import IGNORE, TEMPLATE
    from unroll import Net, expand
    from unroll.core.proto import to_text

    net_param = expand(TEMPLATE, steps=2000, batch=32, symbols=132, part="train", embed=64,
                       hidden=256, ignore_label=IGNORE)
    budget = int(Net(net_param).inspect().recompute["planned_bytes"] * args.charlm_budget)
    best_cpu = best_wall = float("inf")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "charlm.prototxt"
        path.write_text(to_text(net_param))
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "unroll.tools.cli", "memory", str(path),
                            "--budget", str(budget)], cwd=Path.cwd(), check=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
            best_wall = min(best_wall, time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            best_cpu = min(best_cpu, after.ru_utime + after.ru_stime - before.ru_utime
                           - before.ru_stime)
    print(f"char LM T=2000: unroll memory --budget {args.charlm_budget:g} of its full plan "
          f"{best_cpu:.2f} s of CPU ({best_wall:.2f} s wall)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="*", default=[1000, 5000, 20000])
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (the least)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--charlm-budget", type=float, default=0.5, metavar="FRACTION")
    parser.add_argument("--no-charlm", action="store_true", help="skip unroll memory")
    parser.add_argument("--cases", action="store_true",
                        help="also expand the tagger's nets (first expansions, uncached)")
    args = parser.parse_args(argv)
    now = clock(args.clock)
    print(f"{args.clock} seconds, the least of {args.repeat} run(s); {Path.cwd()}")
    if args.cases:
        from unroll.frontend.unroller import expand

        for label, (template, variables) in CASES.items():
            start = now()
            net_param = expand(template, **variables)
            print(f"expand {label}: {now() - start:.3f} s, {len(net_param.layer):,} layers")
    lstm_figures(args, now)
    if not args.no_charlm:
        charlm_figures(args)


if __name__ == "__main__":
    main()
