"""Microseconds per recurrent-unit call: the fused kernels against the ``xp`` reference.

Times one LSTMUnit and one GRUUnit layer, forward and backward separately, on
(1, N, H) blobs as an unrolled step feeds them (N=32; H=128 and 512 by
default), for both engines. Compilation (numba's first call) happens before
the clock starts. Prints medians over several rounds. A benchmark, not a
test: run it on an idle machine, with nothing else on the cores.

    python -m bench.bench_units                      (from the repository root)
    python -m bench.bench_units --hidden 128 --dtype float64
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from bench.timing import median_seconds
from unroll.core.proto import LayerParameter, parse_text
from unroll.engine.blob import Blob
from unroll.engine.kernels import ENGINE_VARIABLE
from unroll.engine.layer import layer_class

UNITS = {"LSTMUnit": (4, 1, 2), "GRUUnit": (3, 2, 1)}  # gates, projections, tops


def build(unit: str, N: int, H: int, dtype, engine: str):
    """A set-up layer, its bottoms (random values) and tops with random diffs."""
    gates, n_projections, n_tops = UNITS[unit]
    os.environ[ENGINE_VARIABLE] = engine
    param = parse_text(f'name: "{unit}" type: "{unit}"', LayerParameter())
    layer = layer_class(param)(param, dtype=dtype)
    rng = np.random.default_rng(0)
    shapes = [(1, N, H)] + [(1, N, gates * H)] * n_projections + [(1, N)]
    bottoms = [Blob(s, np, dtype, f"b{i}") for i, s in enumerate(shapes)]
    for b in bottoms[:-1]:
        b.data[...] = rng.uniform(-2, 2, b.shape)
    bottoms[-1].data[...] = 1.0
    tops = [Blob((), np, dtype, f"t{i}") for i in range(n_tops)]
    layer.set_up(bottoms, tops)
    for t in tops:
        t.diff[...] = rng.uniform(-1, 1, t.shape)
    return layer, bottoms, tops


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="N (default 32)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512], help="H values")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    dtype = np.dtype(args.dtype)
    propagate = {"LSTMUnit": [True, True, False], "GRUUnit": [True, True, True, False]}
    print(f"unit      H  engine     forward us  backward us  total us   ({args.dtype}, "
          f"N={args.batch}, median of {args.rounds} x {args.calls} calls)")
    for unit in UNITS:
        for H in args.hidden:
            totals = {}
            for engine in ("reference", "fused"):
                layer, bottoms, tops = build(unit, args.batch, H, dtype, engine)

                def forward(layer=layer, bottoms=bottoms, tops=tops):
                    layer.forward(bottoms, tops)

                def backward(layer=layer, bottoms=bottoms, tops=tops, unit=unit):
                    layer.backward(tops, propagate[unit], bottoms)

                # the warm-up compiles (or loads) the kernels
                f = median_seconds(forward, args.calls, args.rounds) * 1e6
                b = median_seconds(backward, args.calls, args.rounds) * 1e6
                totals[engine] = f + b
                print(f"{unit:8s} {H:4d}  {engine:9s} {f:11.1f} {b:12.1f} {f + b:9.1f}")
            speedup = totals["reference"] / totals["fused"]
            print(f"{unit:8s} {H:4d}  reference / fused: {speedup:.2f}x")


if __name__ == "__main__":
    main()
