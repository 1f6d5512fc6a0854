"""Would independent branches gain from running at once? Two LSTM layers, serial vs threads.

The two directions of a bidirectional layer (or the two character LSTMs) are
independent chains of layers. This measures what running such chains
concurrently could give on this machine, before any scheduler exists: two
independent unrolled LSTM nets (``unroll.expand("lstm")`` + EuclideanLoss,
T=25, N=32, D=100, H=128 by default), forward and backward, one after the
other against one per thread (NumPy's GEMMs and the numba units release the
GIL). Prints median milliseconds per pair over several rounds and the ratio.
A benchmark, not a test: run it on an idle machine, and once with
OPENBLAS_NUM_THREADS=1 too (two threads each asking BLAS for its own pool
oversubscribe the cores).

    python -m bench.bench_branches                (from the repository root)
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from unroll import Net, expand


def lstm_net(T: int, N: int, D: int, H: int, seed: int):
    net_param = expand("lstm", steps=T, batch=N, input_dim=D, hidden=H)
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, N, H])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                        top=["loss"])
    net = Net(net_param, seed=seed)
    rng = np.random.default_rng(seed)
    cont = np.ones((T, N))
    cont[0] = 0
    net.forward(x=rng.normal(size=(T, N, D)), cont=cont,
                target=rng.uniform(-1, 1, (T, N, H)))
    return net


def step(net) -> None:
    net.forward()
    net.backward()


def median_ms(run, iters: int, rounds: int) -> float:
    run()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            run()
        times.append((time.perf_counter() - start) / iters * 1e3)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input-dim", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    a, b = (lstm_net(args.steps, args.batch, args.input_dim, args.hidden, seed)
            for seed in (0, 1))
    pool = ThreadPoolExecutor(max_workers=1)

    def serial():
        step(a)
        step(b)

    def concurrent():
        other = pool.submit(step, b)
        step(a)
        other.result()

    t_serial = median_ms(serial, args.iters, args.rounds)
    t_threads = median_ms(concurrent, args.iters, args.rounds)
    print(f"two LSTM layers T={args.steps} N={args.batch} D={args.input_dim} "
          f"H={args.hidden}, forward + backward each")
    print(f"one after the other  {t_serial:8.2f} ms")
    print(f"one thread each      {t_threads:8.2f} ms   (serial / threads = "
          f"{t_serial / t_threads:.2f}x)")
    pool.shutdown()


if __name__ == "__main__":
    main()
