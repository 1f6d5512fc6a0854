"""Memory of the default tagger: the memory plan's bytes per net, and tagging one long line.

For each T, builds the train- and test-phase nets of the default tagger
(examples/pos_tagging, features and vocabularies from the EWT training file)
and prints ``net.memory_report()``'s figures: the unplanned bytes (every blob
its own memory, as pycaffe) against the planned ones (kept blobs plus the
shared workspace). Then tags one line of ``--line-words`` words in a fresh
process and prints its time and peak RSS. A benchmark, not a test.

    python -m bench.bench_memory --steps 10 50 100 --line-words 10000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ud_english_ewt"
MIB = 2.0**20


def default_tagger(data: Path, sentences: int):
    from examples.pos_tagging.conll import read_conllu
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.tagger import Tagger, TaggerConfig

    sents = [s for _, s in zip(range(sentences), read_conllu(data / "en_ewt-ud-train.conllu"))]
    featurizer = Featurizer.build([f for f, _ in sents], min_count={"word": 2})
    return Tagger(featurizer, TaggerConfig(), seed=0), [w for f, _ in sents for w in f]


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
    parser.add_argument("--line-words", type=int, default=0,
                        help="also tag one line of this many words (0: skip)")
    args = parser.parse_args(argv)
    tagger, _ = default_tagger(args.data, args.sentences)
    print(f"{'net':<12} {'unplanned MiB':>14} {'planned MiB':>12} {'kept':>8} {'workspace':>10}"
          f" {'ratio':>6}")
    for T in args.steps:
        for model in (tagger.train_model, tagger.test_model):
            r = model.net(T).memory_report()
            print(f"{model.phase + ' T=' + str(T):<12} {r.unplanned / MIB:14.1f} "
                  f"{r.planned / MIB:12.1f} {r.kept / MIB:8.1f} {r.workspace / MIB:10.1f} "
                  f"{r.unplanned / max(r.planned, 1):6.1f}")
    print(f"params {tagger.train_model.store.nbytes / MIB:.1f} MiB (data and diff, all nets)")
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
