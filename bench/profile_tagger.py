"""Where the default tagger's training step spends its time, at one thread and at two.

Builds the default tagger (``TaggerConfig()``) on UD English EWT train, its packed
training batches and its solver as ``examples.pos_tagging.train`` does, and times, at
each ``--threads`` count, a run of ``--iters`` batches (``solver.step`` and the
parameter average, what training times), first bare, then with every layer's forward,
backward and batched weight gradient timed and summed by part of the model:

- word BiLSTM: the two stacked bidirectional layers (``l0_*``, ``l1_*``);
- char LSTM: the two character nets (``char_*``), their concat and scatter;
- Embeds: every Embed (words, features, characters);
- output + loss: the scores' InnerProduct, SoftmaxWithLoss, Accuracy;
- other layers: dropout, the token concat, the input slices;
- update: the solver's update (clipping, Adam over the flat buffers), its clipping
  (the norm and the scaling of every diff) also on a line of its own;
- averaging: ``ParamAverage.update``;
- Python fixed cost: the rest of the timed run (the nets' loops, input views, the
  solver's bookkeeping, the timers' own few µs a call).

Batch assembly (``batch_inputs``: word dropout, features, character packing, the one
transfer) is outside training's timed region; it is timed apart, per batch. Each part
is also split by layer type, and its GEMMs (the InnerProducts) by product and pass.
With ``--cprofile`` the run at the first thread count is also profiled and its top
functions printed.

Both clocks are printed: wall time and the process's CPU time (all its threads). On a
busy machine only CPU time at one thread is steady.

    python -m bench.profile_tagger                     (from the repository root)
    python -m bench.profile_tagger --threads 1 2 --iters 40 --cprofile
    python -m bench.profile_tagger --threads 1 --root ../before    (another checkout's step)
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from bench.timing import layer_passes, patched

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ud_english_ewt"
PARTS = ("word BiLSTM", "char LSTM", "Embeds", "output + loss", "other layers", "update",
         "averaging", "Python fixed cost")


def part_of(layer) -> str:
    if layer.type == "Embed":
        return "Embeds"
    if layer.name.startswith(("l0_", "l1_")):
        return "word BiLSTM"
    if layer.name.startswith("char"):
        return "char LSTM"
    if layer.type in ("SoftmaxWithLoss", "Accuracy") or layer.name == "scores":
        return "output + loss"
    return "other layers"


def kind_of(layer, method: str) -> str:
    """The layer's type, or for a GEMM which product: the input projection over every
    step, a step's recurrent product, or another; its forward, backward (the bottom's
    diff, and the weights' where not batched) or batched weight gradient."""
    if layer.type != "InnerProduct":
        return layer.type
    role = ("input projection" if "x_proj" in layer.name
            else "recurrent" if "_hc_t" in layer.name else "other")
    return f"GEMM {role}, {method}"


class Clock:
    """Wall and CPU seconds spent, by key."""

    def __init__(self):
        self.wall = collections.defaultdict(float)
        self.cpu = collections.defaultdict(float)

    def timed(self, function, *keys):
        def run(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                for key in keys:
                    self.cpu[key] += cpu
                    self.wall[key] += wall
        return run


@contextmanager
def instrumented(clock: Clock, nets, solver, average):
    """Every layer of ``nets``, the solver's update (its clipping apart too) and the
    average's update timed."""
    from unroll.train import solver_callbacks

    with patched() as patch:
        for layer, name in layer_passes(nets):
            patch(layer, name, clock.timed(getattr(layer, name), part_of(layer),
                                           (part_of(layer), kind_of(layer, name))))
        patch(solver, "_update", clock.timed(solver._update, "update"))
        patch(solver_callbacks, "clip_gradients",
              clock.timed(solver_callbacks.clip_gradients, ("update", "clip_gradients")))
        patch(average, "update", clock.timed(average.update, "averaging"))
        yield


def build(data: Path, iters: int, seed: int):
    """The default tagger's solver, average and the first ``iters`` + 3 packed batches."""
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.packing import batch_inputs, training_sampler
    from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids
    from examples.pos_tagging.train import TrainOptions, training_solver
    from unroll.tools.conllu import read_conllu
    from unroll.train.trainer import ParamAverage

    sents = list(read_conllu(data / "en_ewt-ud-train.conllu"))
    tagger = Tagger(Featurizer.build([f for f, _ in sents]), TaggerConfig(), seed=seed)
    encoded, gold = tagger.encode([f for f, _ in sents]), tag_ids([t for _, t in sents])
    sampler = training_sampler([len(f) for f, _ in sents], tagger.config.batch, seed)
    solver = training_solver(tagger.train_model, TrainOptions(data=data, model_dir=Path()),
                             len(sampler))
    average = ParamAverage(tagger.train_model.learnable_params)
    batches = sampler.epoch_batches(0)[: iters + 3]
    for length in {sampler.bucket_length(b) for b in batches}:
        tagger.train_model.net(length)
    start = time.perf_counter()
    feeds = [batch_inputs(tagger, encoded, gold, b, sampler) for b in batches]
    assembly = (time.perf_counter() - start) / len(batches)
    return tagger, solver, average, feeds, assembly


def measure(step, feeds, nets, solver, average):
    """(wall ms, CPU ms) per batch by key, and the real tokens per batch."""
    for inputs, _ in feeds[:3]:  # first-call costs out of the way
        step(inputs)
    timed = feeds[3:]
    wall, cpu = time.perf_counter(), time.process_time()
    for inputs, _ in timed:
        step(inputs)
    bare_wall, bare_cpu = time.perf_counter() - wall, time.process_time() - cpu
    clock = Clock()
    with instrumented(clock, nets, solver, average):
        wall, cpu = time.perf_counter(), time.process_time()
        for inputs, _ in timed:
            step(inputs)
        total_wall, total_cpu = time.perf_counter() - wall, time.process_time() - cpu
    parts = [p for p in PARTS if p != "Python fixed cost"]
    clock.wall["Python fixed cost"] = total_wall - sum(clock.wall[p] for p in parts)
    clock.cpu["Python fixed cost"] = total_cpu - sum(clock.cpu[p] for p in parts)
    clock.wall["bare total"], clock.cpu["bare total"] = bare_wall, bare_cpu
    per = 1e3 / len(timed)
    return ({k: per * v for k, v in clock.wall.items()},
            {k: per * v for k, v in clock.cpu.items()},
            sum(n for _, n in timed) / len(timed))


def report(counts, results, assembly: float) -> None:
    print("\nms per batch, wall | CPU, at each thread count")
    print(f"  {'':24s}" + "".join(f"{'threads ' + c:>22s}" for c in counts))
    for part in (*PARTS, "bare total"):
        cells = "".join(f"{w[part]:10.2f} |{c[part]:9.2f}" for w, c, _ in results)
        print(f"  {part:24s}{cells}")
    tokens = results[0][2]
    rates = "".join(f"{1e3 * tokens / w['bare total']:20.0f}  " for w, _, _ in results)
    print(f"  {'tokens/s (bare, wall)':24s}{rates}")
    print(f"  batch assembly (untimed in training): {1e3 * assembly:.2f} ms per batch, "
          f"{tokens:.0f} real tokens per batch")
    print("\nby part and layer type, ms per batch, wall | CPU")
    keys = sorted({k for _, c, _ in results for k in c if isinstance(k, tuple)},
                  key=lambda k: (PARTS.index(k[0]), -results[0][1][k]))
    for key in keys:
        cells = "".join(f"{w.get(key, 0.0):10.2f} |{c.get(key, 0.0):8.2f}" for w, c, _ in results)
        print(f"  {key[0] + ': ' + key[1]:48s}{cells}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--iters", type=int, default=30, help="batches timed per count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cprofile", action="store_true",
                        help="profile the first count's run too; print its top functions")
    parser.add_argument("--root", type=Path,
                        help="the checkout whose unroll and examples are profiled (default: this)")
    args = parser.parse_args(argv)
    if args.root is not None:
        sys.path.insert(0, str(args.root.resolve()))
    from unroll.engine import threads

    print(f"profiling {Path(threads.__file__).resolve().parents[2]}")
    tagger, solver, average, feeds, assembly = build(args.data, args.iters, args.seed)
    nets = list(tagger.train_model.nets.values())

    def step(inputs):
        solver.step(1, feed=inputs)
        average.update()

    print(f"machine: {threads.cores()} cores, others busy {threads.others_busy():.2f} "
          f"cores over the last second")
    results = []
    for count in args.threads:
        threads.set_num_threads(count)
        results.append(measure(step, feeds, nets, solver, average))
    report([str(c) for c in args.threads], results, assembly)
    if args.cprofile:
        threads.set_num_threads(args.threads[0])
        profiler = cProfile.Profile()
        profiler.enable()
        for inputs, _ in feeds[3:]:
            step(inputs)
        profiler.disable()
        print(f"\ncProfile at {args.threads[0]} thread(s), {len(feeds) - 3} batches:")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    threads.set_num_threads(None)


if __name__ == "__main__":
    main()
