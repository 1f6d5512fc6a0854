"""Independent branches at once: a bidirectional LSTM layer, serial against concurrent.

The two directions of a bidirectional layer are chains that meet only at their
Concat; ``Net(concurrent=True)`` runs them on two threads (NumPy's GEMMs and the
numba units release the GIL). This times one forward and backward of
``unroll.expand("lstm", direction="bidirectional")`` + EuclideanLoss (T=25,
N=32, D=100, H=128 by default) both ways, and checks that the gradients are
bit-identical. Prints median milliseconds per step over several rounds. A
benchmark, not a test: run it on an idle machine, and once with
OPENBLAS_NUM_THREADS=1 too (two threads each asking BLAS for its own pool
oversubscribe the cores).

    python -m bench.bench_branches                (from the repository root)
"""

from __future__ import annotations

import numpy as np

from bench.options import net_size_parser
from bench.timing import median_seconds
from unroll import Net, expand
from unroll.train.bucketing import cont_from_lengths


def bidirectional_net(args, concurrent: bool):
    T, N, H = args.steps, args.batch, args.hidden
    net_param = expand("lstm", steps=T, batch=N, input_dim=args.input_dim, hidden=H,
                       direction="bidirectional")
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, N, 2 * H])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                        top=["loss"])
    return Net(net_param, concurrent=concurrent)


def main(argv=None) -> None:
    parser = net_size_parser(__doc__, steps=25, batch=32, hidden=128)
    parser.add_argument("--input-dim", type=int, default=100)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    T, N = args.steps, args.batch
    feed = dict(x=rng.normal(size=(T, N, args.input_dim)),
                cont=cont_from_lengths(rng.integers(1, T + 1, N), T),
                target=rng.uniform(-1, 1, (T, N, 2 * args.hidden)))
    times, grads = {}, {}
    for concurrent in (False, True):
        net = bidirectional_net(args, concurrent)
        net.forward(**feed)

        def step(net=net):
            net.clear_param_diffs()
            net.forward()
            net.backward()

        times[concurrent] = median_seconds(step, args.iters, args.rounds) * 1e3
        grads[concurrent] = [p.blob.diff.copy() for p in net.learnable_params]
    same = all(np.array_equal(a, b) for a, b in zip(grads[False], grads[True]))
    print(f"bidirectional LSTM T={T} N={N} D={args.input_dim} H={args.hidden}, "
          f"forward + backward")
    print(f"serial           {times[False]:8.2f} ms")
    print(f"concurrent=True  {times[True]:8.2f} ms   (serial / concurrent = "
          f"{times[False] / times[True]:.2f}x; gradients bit-identical: {same})")


if __name__ == "__main__":
    main()
