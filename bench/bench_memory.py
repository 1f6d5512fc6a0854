"""Memory of the default tagger: the memory plan's bytes per net, and tagging one long line.

For each T, builds the train- and test-phase nets of the default tagger
(examples/pos_tagging, features and vocabularies from the EWT training file)
and prints ``net.memory_report()``'s figures: the unplanned bytes (every blob
its own memory, as pycaffe) against the planned ones (kept blobs plus the
shared workspace). Beside them, what the net itself costs: its build time and
the bytes of the Python objects it holds (layers, blobs, graph, plan; traced
by tracemalloc, the NetParameter it shares excluded). With ``--buckets``, the
time to build every bucket's nets, train and test, as the first epoch of the
default training does. Then tags one line of ``--line-words`` words in a
fresh process and prints its time and peak RSS. A benchmark, not a test.

    python -m bench.bench_memory --steps 10 50 100 --buckets --line-words 10000
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import resource
import time
import tracemalloc
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ud_english_ewt"
MIB = 2.0**20


def default_tagger(data: Path, sentences: int):
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.tagger import Tagger, TaggerConfig
    from unroll.tools.conllu import read_conllu

    sents = [s for _, s in zip(range(sentences), read_conllu(data / "en_ewt-ud-train.conllu"))]
    featurizer = Featurizer.build([f for f, _ in sents], min_count={"word": 2})
    return Tagger(featurizer, TaggerConfig(), seed=0), [w for f, _ in sents for w in f]


def net_cost(model, steps: int) -> tuple[float, int]:
    """(seconds to build, bytes it holds) of one more net of ``model`` unrolled to ``steps``."""
    from unroll.engine.net import Net

    def build():
        return Net(model.net(steps).net_param, phase=model.phase, param_store=model.store)

    start = time.perf_counter()
    build()
    seconds = time.perf_counter() - start
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    net = build()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del net
    return seconds, held


def build_buckets(args) -> None:
    """Build the nets of every bucket of the default training, train and test, timed."""
    from unroll.tools.conllu import read_conllu
    from unroll.train.bucketing import BucketSampler

    tagger, _ = default_tagger(args.data, args.sentences)
    lengths = [len(f) for f, _ in read_conllu(args.data / "en_ewt-ud-train.conllu")]
    buckets = BucketSampler(lengths, batch_size=tagger.config.batch).boundaries
    for T in buckets:  # expanded beforehand: the figure is the nets' own
        tagger.net_param(T)
    todo = [(model, T) for T in buckets for model in (tagger.train_model, tagger.test_model)
            if T not in model.nets]  # the tagger built T = 1 already
    start = time.perf_counter()
    steps = sum(len(model.net(T).layers_run) for model, T in todo)
    seconds = time.perf_counter() - start
    print(f"{len(todo)} bucket nets (T = {buckets[0]}..{buckets[-1]}, train and test, "
          f"{steps} layers with splits) built in {seconds:.2f} s")


def tag_line(args, queue) -> None:
    tagger, words = default_tagger(args.data, args.sentences)
    words = (words * (1 + args.line_words // max(1, len(words))))[: args.line_words]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    tags = tagger.predict([words], batch_size=1)
    queue.put({"seconds": time.perf_counter() - start, "words": len(tags[0]),
               "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "before_mb": before})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--sentences", type=int, default=5000,
                        help="training sentences that build the vocabularies")
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--buckets", action="store_true",
                        help="also time building every bucket's train and test nets")
    parser.add_argument("--line-words", type=int, default=0,
                        help="also tag one line of this many words (0: skip)")
    args = parser.parse_args(argv)
    tagger, _ = default_tagger(args.data, args.sentences)
    print(f"{'net':<12} {'unplanned MiB':>14} {'planned MiB':>12} {'kept':>8} {'workspace':>10}"
          f" {'ratio':>6} {'build ms':>9} {'net MiB':>8} {'B/layer':>8}")
    for T in args.steps:
        for model in (tagger.train_model, tagger.test_model):
            net = model.net(T)
            r = net.memory_report()
            seconds, held = net_cost(model, T)
            print(f"{model.phase + ' T=' + str(T):<12} {r.unplanned / MIB:14.1f} "
                  f"{r.planned / MIB:12.1f} {r.kept / MIB:8.1f} {r.workspace / MIB:10.1f} "
                  f"{r.unplanned / max(r.planned, 1):6.1f} {1000 * seconds:9.1f} "
                  f"{held / MIB:8.2f} {held / len(net.layers_run):8.0f}")
    print(f"params {tagger.train_model.store.nbytes / MIB:.1f} MiB (data and diff, all nets)")
    if args.buckets:
        build_buckets(args)
    if args.line_words:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=tag_line, args=(args, queue))
        proc.start()
        r = queue.get()
        proc.join()
        print(f"tagging one line of {r['words']} words: {r['seconds']:.1f} s, peak RSS "
              f"{r['peak_mb']:.0f} MB ({r['before_mb']:.0f} MB before tagging)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
