"""CPU seconds of each part of building a long net: ``Net()`` of an unrolled LSTM layer.

The net is bench_recompute's (one LSTM layer, H hidden, N sequences, T steps, a Euclidean
loss at each step; ``--loss whole``: one over the whole output), built under
``memory_budget`` of ``--budget`` of its full plan (which is planned first, in the same
process, and not timed). Each part is timed where Net() calls it, in CPU seconds of this
process, the parts nested in another counted in both: the layers' set-up
(:func:`unroll.engine.executor.set_up`), the graph rules (:func:`unroll.graph.rules.build_graph`,
:func:`~unroll.graph.rules.backward_needs`, :func:`~unroll.graph.rules.filter_layers`), the
memory plan (:meth:`unroll.engine.executor.NetMemory.plan`, the budget's search,
:func:`unroll.engine.memory.within_budget`, and the livenesses and schedules they make),
and the unroller (``expand``) before it, apart. (The character LM's ``unroll memory
--budget`` is timed by ``python -m bench.bench_recompute --charlm``.)

    python -m bench.bench_net_build --steps 20000 --budget 0.02
"""

from __future__ import annotations

import functools
import time

from bench.bench_recompute import lstm_net
from bench.options import net_size_parser

#: (module, function, label) of each part timed
PARTS = (("unroll.engine.executor", "set_up", "layers set up"),
         ("unroll.graph.rules", "build_graph", "graph: build_graph"),
         ("unroll.graph.rules", "backward_needs", "graph: backward_needs"),
         ("unroll.graph.rules", "filter_layers", "graph: filter_layers"),
         ("unroll.engine.memory", "within_budget", "the budget's search"),
         ("unroll.engine.memory", "liveness", "livenesses (all)"),
         ("unroll.engine.memory", "schedule", "schedules"),
         ("unroll.engine.executor", "actions", "the schedules' actions"))


def timed_parts() -> dict[str, float]:
    """Wrap each part of :data:`PARTS` where Net() looks it up; returns the seconds, by label,
    that the wrappers add to."""
    import importlib

    from unroll.engine import executor

    seconds: dict[str, float] = {}

    def wrap(owner, name, label):
        function = getattr(owner, name)

        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[label] = seconds.get(label, 0.0) + time.process_time() - start

        setattr(owner, name, timed)

    for module, name, label in PARTS:
        wrap(importlib.import_module(module), name, label)
    wrap(executor.NetMemory, "plan", "NetMemory.plan")
    return seconds


def main(argv=None) -> None:
    parser = net_size_parser(__doc__, steps=20000, batch=32, hidden=256)
    parser.add_argument("--loss", choices=["per-step", "whole"], default="per-step")
    parser.add_argument("--budget", type=float, default=0.02,
                        help="the budget, as a fraction of the full plan (default 1/50)")
    args = parser.parse_args(argv)
    from unroll import Net

    T, N, H, per_step = args.steps, args.batch, args.hidden, args.loss == "per-step"
    full = Net(lstm_net(T, N, H, per_step)).inspect().recompute["planned_bytes"]
    Net(lstm_net(70, N, H, per_step), recompute="sqrt")  # imports, kernels: not the build's
    seconds = timed_parts()
    start = time.process_time()
    net_param = lstm_net(T, N, H, per_step)
    expand = time.process_time() - start
    start = time.process_time()
    Net(net_param, memory_budget=int(full * args.budget))
    total = time.process_time() - start
    print(f"LSTM layer T={T} H={H} N={N}, loss {args.loss}, memory_budget {args.budget:g} of "
          f"the full plan: Net() {total:.2f} s of CPU (the unroller before it {expand:.2f} s)")
    for label, s in sorted(seconds.items(), key=lambda item: -item[1]):
        print(f"  {label:<28} {s:7.2f} s")


if __name__ == "__main__":
    main()
