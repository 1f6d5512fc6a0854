"""Where a training step and a decoding step spend their time, at one thread and at two.

Each workload runs at every ``--threads`` count (``set_num_threads``; "policy" is the
measured policy of ``unroll.engine.threads``), first bare, for its total, then with
every layer's forward, backward and batched weight gradient timed and summed:

- GEMMs: the InnerProducts (input projections, recurrent, data and weight gradients);
- elementwise: every other layer (the recurrent units, Scale, Eltwise, Embed, Softmax,
  the loss);
- update: the solver's update (Adam's fused kernel, SGD's axpby);
- thread policy: ``num_threads`` and the pool's set and restore around each net run,
  with the pool sizes it chose;
- Python fixed cost: the rest of the timed run (the net's loops, fills, inputs, the
  solver's and the Stepper's bookkeeping, and the timers' own few µs a call); the bare
  total is the same calls untimed.

Both clocks are printed: wall time and the process's CPU time (all its threads; a
second thread that spins shows as CPU time, not as speed). On a busy machine only CPU
time at one thread is steady; the wall time at two threads is what a user sees, on an
idle machine.

Workloads: the LSTM step of ``bench/bench_lstm.py`` (T=25/100 x H=128/512, N=32, D=100,
float32), the seq2seq step of ``bench/bench_seq2seq.py`` (its defaults), and greedy
decoding (``unroll.train.decoding.greedy``) by a one-step LSTM (H=256) with a softmax
head over 40 tokens, 32 sequences of 20 steps, one Stepper call per step; and greedy
decoding by the attending lemmatizer of ``examples/lemmatize`` (256 dev words, its
encoder included).

    python -m bench.profile_threads                       (from the repository root)
    python -m bench.profile_threads --only lstm --threads 1 2 policy
    python -m bench.profile_threads --products    # the decoder's GEMMs by rows, 1 and 2 threads
    python -m bench.profile_threads --only lstm --by-layer   # each layer type's passes too

``--by-layer`` adds each layer type's forward, backward and weight gradient (ms per
call, wall | CPU, and µs a layer call at the first count): which layers of the
elementwise phase cost, and how much of a small layer's time is its call.
"""

from __future__ import annotations

import argparse
import collections
import time
from contextlib import contextmanager

import numpy as np

from bench.timing import layer_passes, patched

PHASES = ("GEMMs", "elementwise", "update", "thread policy", "Python fixed cost")
LSTM_SIZES = ((25, 128), (25, 512), (100, 128), (100, 512))


class Clock:
    """Wall and CPU seconds spent, by phase."""

    def __init__(self):
        self.wall = collections.defaultdict(float)
        self.cpu = collections.defaultdict(float)
        self.pools = collections.Counter()
        #: (layer type, pass) -> [wall, CPU, calls], for --by-layer
        self.layers = collections.defaultdict(lambda: [0.0, 0.0, 0])

    def timed(self, function, phase, layer_pass=None):
        def run(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                cpu = time.process_time() - cpu
                wall = time.perf_counter() - wall
                self.cpu[phase] += cpu
                self.wall[phase] += wall
                if layer_pass is not None:
                    spent = self.layers[layer_pass]
                    spent[0] += wall
                    spent[1] += cpu
                    spent[2] += 1
        return run


def phase_of(layer) -> str:
    return "GEMMs" if layer.type == "InnerProduct" else "elementwise"


@contextmanager
def instrumented(clock: Clock, nets, solver=None):
    """Every layer of ``nets``, the ``solver``'s update and the thread policy timed."""
    from unroll.engine import executor

    with patched() as patch:
        for layer, name in layer_passes(nets):
            patch(layer, name, clock.timed(getattr(layer, name), phase_of(layer),
                                           (layer.type, name)))
        if solver is not None:
            # step() applies its update through _update, not the public update()
            patch(solver, "_update", clock.timed(solver._update, "update"))
        policy = executor.run_threads

        class timed_threads(policy):
            def __init__(self, n=None):
                clock.timed(policy.__init__, "thread policy")(self, n)
                clock.pools[self.n] += 1

            __enter__ = clock.timed(policy.__enter__, "thread policy")
            __exit__ = clock.timed(policy.__exit__, "thread policy")

        patch(executor, "num_threads", clock.timed(executor.num_threads, "thread policy"))
        patch(executor, "run_threads", timed_threads)
        yield


def measure(run, iters: int, nets, solver=None) -> tuple[dict, dict, dict, dict]:
    """(wall ms, CPU ms) per call of ``run`` by phase, the pool sizes chosen, and
    {(layer type, pass): (wall ms, CPU ms, layer calls) per call of ``run``}."""
    for _ in range(3):  # compilation, allocation
        run()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(iters):
        run()
    total_wall, total_cpu = time.perf_counter() - wall, time.process_time() - cpu
    clock = Clock()
    with instrumented(clock, nets, solver):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(iters):
            run()
        # the rest of the timed run, the timers' own cost (a few µs a call) included
        clock.wall["Python fixed cost"] = time.perf_counter() - wall - sum(clock.wall.values())
        clock.cpu["Python fixed cost"] = time.process_time() - cpu - sum(clock.cpu.values())
    per = 1e3 / iters
    layers = {key: (per * wall, per * cpu, calls / iters)
              for key, (wall, cpu, calls) in clock.layers.items()}
    return ({p: per * clock.wall[p] for p in PHASES} | {"bare total": per * total_wall},
            {p: per * clock.cpu[p] for p in PHASES} | {"bare total": per * total_cpu},
            dict(clock.pools), layers)


def lstm_step(T: int, H: int, N: int = 32, D: int = 100):
    from unroll import Net, Solver, expand

    net_param = expand("lstm", steps=T, batch=N, input_dim=D, hidden=H)
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, N, H])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                        top=["loss"])
    solver = Solver(Net(net_param), type="SGD", base_lr=0.01)
    rng = np.random.default_rng(0)
    cont = np.ones((T, N), np.float32)
    cont[0] = 0
    feed = {"x": rng.standard_normal((T, N, D)).astype(np.float32), "cont": cont,
            "target": rng.uniform(-1, 1, (T, N, H)).astype(np.float32)}
    return (lambda: solver.step(1, feed=feed)), [solver.net], solver


def seq2seq_step():
    from bench import bench_seq2seq

    # bench_seq2seq's defaults
    defaults = argparse.Namespace(vocab=40, steps=20, batch=32, embed=64, hidden=256,
                                  lr=1e-3, batches=8)
    net, solver, feeds = bench_seq2seq.unroll_model(defaults)
    done = [0]

    def step():
        solver.step(1, feed=feeds[done[0] % len(feeds)])
        done[0] += 1

    return step, [net], solver


def greedy_decoding(N: int = 32, H: int = 256, V: int = 40, steps: int = 20):
    from unroll import Stepper, expand, to_prototxt
    from unroll.train.decoding import StepperDecoder, greedy

    text = to_prototxt(expand("lstm", steps=1, batch=N, input_dim=1, hidden=H,
                              expose_hidden=True)) + f"""
layer {{ name: "head" type: "InnerProduct" bottom: "h" top: "scores"
        inner_product_param {{ num_output: {V} axis: 2
                              weight_filler {{ type: "gaussian" std: 0.3 }} }} }}
layer {{ name: "probs" type: "Softmax" bottom: "scores" top: "probs"
        softmax_param {{ axis: 2 }} }}"""
    stepper = Stepper(text)
    decoder = StepperDecoder(stepper, token="x", output="probs")
    zeros = np.zeros((1, N, H), np.float32)

    def decode():
        decoder.start({"h_0": zeros, "c_0": zeros})
        # eos = V: never drawn, so every sequence runs all the steps
        greedy(decoder, batch=N, bos=0, eos=V, max_len=steps)

    return decode, [stepper.net], None


def lemmatizer_decoding(length: int = 6, batch: int = 256):
    """Greedy decoding by the attending lemmatizer (examples/lemmatize, untrained: it
    decodes to its max_len) of ``batch`` dev words of ``length`` characters, one Stepper
    call per step, the attention memory a static input, the encoder run once per call."""
    from examples.lemmatize.conll import read_lemmas
    from examples.lemmatize.model import Lemmatizer, LemmatizerConfig
    from examples.lemmatize.train import words_of
    from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, data_dir

    data = data_dir(None)
    lemmatizer = Lemmatizer.build(words_of(read_lemmas(data / TRAIN_FILE)[:300]),
                                  LemmatizerConfig(), seed=0)
    words = sorted({(f, u) for f, u, _ in words_of(read_lemmas(data / DEV_FILE))
                    if len(f) == length})
    words = (words * (batch // len(words) + 1))[:batch]

    def decode():
        lemmatizer.predict(words, edits=False)

    decode()  # builds the encoder of this length
    return decode, [lemmatizer.stepper.net, *lemmatizer.encoders.nets.values()], None


def workloads(only: str | None):
    if only in (None, "lstm"):
        for T, H in LSTM_SIZES:
            yield f"lstm step T={T} H={H}", lambda T=T, H=H: lstm_step(T, H)
    if only in (None, "seq2seq"):
        yield "seq2seq step", seq2seq_step
    if only in (None, "greedy"):
        yield "greedy decoding (20 steps)", greedy_decoding
    if only in (None, "lemmatizer"):
        yield "lemmatizer greedy decoding (256 words of 6 characters)", lemmatizer_decoding


#: the products of the lemmatizer's decoder step, (K, num_output): the input projection,
#: the recurrent one, the attention's combination and the output scores (V = 100)
DECODER_PRODUCTS = ((64, 1024), (256, 1024), (512, 256), (256, 100))


def products(counts, rows=(1, 2, 4, 8, 16, 32, 64, 128, 256), calls: int = 20,
             rounds: int = 9) -> None:
    """µs per product y = x W^T of the decoder step's shapes at each number of rows M, at
    each thread count (the least of ``rounds``, the counts in turns): where a second thread
    starts to pay, the size below which a product had better run on one."""
    from bench.timing import least_us_per_call
    from unroll.engine.layers.inner_product import FEW_ROWS, FEW_ROWS_MIN_WIDTH
    from unroll.engine.threads import run_threads

    def product(x, W, y):  # as InnerProduct's forward computes it
        if len(x) <= FEW_ROWS and min(W.shape) >= FEW_ROWS_MIN_WIDTH:
            yT = np.empty(y.shape[::-1], np.float32)
            np.matmul(W, x.T, out=yT)
            np.copyto(y, yT.T)
        else:
            np.matmul(x, W.T, out=y)

    rng = np.random.default_rng(0)
    print(f"\nproducts x (M, K) W^T (K, n), float32, as InnerProduct runs them: µs per "
          f"product (wall, least of "
          f"{rounds}), threads {' / '.join(counts)}")
    for K, n in DECODER_PRODUCTS:
        W = rng.standard_normal((n, K)).astype(np.float32)
        cells = []
        for M in rows:
            x = rng.standard_normal((M, K)).astype(np.float32)
            y = np.empty((M, n), np.float32)
            best = {c: float("inf") for c in counts}
            for _ in range(rounds):
                for c in counts:
                    with run_threads(int(c)):
                        us = least_us_per_call(
                            {c: lambda x=x, W=W, y=y: product(x, W, y)},
                            time.perf_counter, calls, rounds=1, warmup=3)
                    best[c] = min(best[c], us[c])
            cells.append(f"M={M}: " + "/".join(f"{best[c]:.0f}" for c in counts))
        print(f"  K={K} n={n}: " + ", ".join(cells))


def report(name: str, counts, results) -> None:
    print(f"\n{name}: ms per call, wall | CPU, at each thread count")
    print(f"  {'':18s}" + "".join(f"{'threads ' + c:>22s}" for c in counts))
    for phase in (*PHASES, "bare total"):
        cells = "".join(f"{w[phase]:10.2f} |{c[phase]:9.2f}" for w, c, *_ in results)
        print(f"  {phase:18s}{cells}")
    pools = "   ".join(", ".join(f"{n}: {k}x" for n, k in sorted(p.items()))
                       for _, _, p, _ in results)
    print(f"  {'pool sizes chosen':18s}  {pools}")


def report_layers(counts, results) -> None:
    """Each layer type's passes, the costliest (by CPU at the first count) first."""
    first = results[0][3]
    print(f"  {'by layer':28s}" + "".join(f"{'threads ' + c:>22s}" for c in counts)
          + f"{'calls':>8s}{'us a call':>11s}")
    for key in sorted(first, key=lambda k: -first[k][1]):
        cells = "".join(f"{r[3][key][0]:10.3f} |{r[3][key][1]:9.3f}" for r in results)
        wall, _, calls = first[key]
        label = f"{key[0]} {key[1]}"
        print(f"  {label:28s}" + cells + f"{calls:8.0f}{1e3 * wall / calls:11.1f}")


def main(argv=None) -> None:
    from unroll.engine import threads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", nargs="+", default=["1", "2"],
                        help='counts, or "policy" for the measured one (default 1 2)')
    parser.add_argument("--only", choices=["lstm", "seq2seq", "greedy", "lemmatizer"])
    parser.add_argument("--iters", type=int, default=10, help="calls timed per count")
    parser.add_argument("--by-layer", action="store_true",
                        help="each layer type's passes too")
    parser.add_argument("--products", action="store_true",
                        help="only the decoder step's products at 1..256 rows, per count")
    args = parser.parse_args(argv)
    print(f"machine: {threads.cores()} cores, others busy {threads.others_busy():.2f} "
          f"cores over the last second")
    if args.products:
        products([c for c in args.threads if c != "policy"])
        return
    for name, build in workloads(args.only):
        run, nets, solver = build()
        results = []
        for count in args.threads:
            threads.set_num_threads(None if count == "policy" else int(count))
            results.append(measure(run, args.iters, nets, solver))
        threads.set_num_threads(None)
        report(name, args.threads, results)
        if args.by_layer:
            report_layers(args.threads, results)


if __name__ == "__main__":
    main()
