"""Microseconds per layer call of the run loop: the engine's fixed cost per layer.

An unrolled LSTM (``unroll.expand("lstm")`` + EuclideanLoss) with N = D = H = 1,
so that the arithmetic is negligible and what remains is dispatch: the run
loop, each layer's Python and NumPy's call overhead. Prints the median
microseconds per layer call of forward and of backward over several rounds. A
benchmark, not a test: run it on an idle machine.

    python -m bench.bench_dispatch                (from the repository root)
    python -m bench.bench_dispatch --steps 200
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.timing import median_seconds
from unroll import Net, expand


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="T (default 100)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    T = args.steps
    net_param = expand("lstm", steps=T, batch=1, input_dim=1, hidden=1)
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, 1, 1])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                        top=["loss"])
    net = Net(net_param)
    cont = np.ones((T, 1))
    cont[0] = 0
    net.forward(x=np.ones((T, 1, 1)), cont=cont, target=np.zeros((T, 1, 1)))
    calls_fwd = len(net.layers_run)
    calls_bwd = sum(net.layer_need_backward)
    forward = median_seconds(net.forward, args.iters, args.rounds)
    both = median_seconds(lambda: (net.forward(), net.backward()), args.iters, args.rounds)
    print(f"unrolled LSTM, T={T}, N=D=H=1: {calls_fwd} layer calls forward, "
          f"{calls_bwd} backward")
    print(f"forward   {forward / calls_fwd * 1e6:6.2f} us per layer call")
    print(f"backward  {(both - forward) / calls_bwd * 1e6:6.2f} us per layer call")


if __name__ == "__main__":
    main()
