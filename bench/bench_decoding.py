"""Decoding words/s of the lemmatizer through ``unroll.train.decoding``: greedy and beam
search, every live hypothesis in one Stepper call, the attention memory a static input.

Trains the lemmatizer of ``examples/lemmatize`` briefly (``--epochs`` over the first
``--sentences`` training sentences, ``--attention`` as the lemmatizer takes it), then
decodes the distinct dev (form, UPOS) pairs greedily and with beams of 2 and 4 from the
same encoder states, and prints words/s, the seq2seq's accuracy (decoder alone) and how
often each beam agrees with greedy decoding. A benchmark, not a test: run it on an idle
machine.

    python -m bench.bench_decoding --epochs 1 --sentences 4000
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    from examples.lemmatize.model import ATTENTION, Lemmatizer, LemmatizerConfig

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="the folder of EWT's .conllu (default: as the tagger)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--pairs", type=int, default=2000, help="dev pairs decoded")
    parser.add_argument("--attention", choices=ATTENTION, default=LemmatizerConfig.attention)
    args = parser.parse_args(argv)

    from examples.lemmatize.conll import read_lemmas
    from examples.lemmatize.train import words_of
    from unroll import Solver
    from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, data_dir

    data = data_dir(args.data)
    train_words = words_of(read_lemmas(data / TRAIN_FILE)[:args.sentences])
    dev_words = words_of(read_lemmas(data / DEV_FILE))
    lemmatizer = Lemmatizer.build(train_words, LemmatizerConfig(attention=args.attention),
                                  seed=0)
    model = lemmatizer.train_model
    solver = Solver(model, type="Adam", base_lr=3e-3, momentum=0.9, momentum2=0.999,
                    delta=1e-8, clip_gradients=5.0)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(args.epochs):
        for key, inputs in lemmatizer.batches(sorted(set(train_words)), rng):
            model.clear_param_diffs()
            model.forward(widths=key, **inputs)
            model.backward()
            solver.update()
    print(f"trained {args.epochs} epoch(s) on {len(train_words)} words in "
          f"{time.perf_counter() - start:.0f} s")
    pairs = sorted({(f, u) for f, u, _ in dev_words if lemmatizer.fits(f)})[:args.pairs]
    gold = dict(((f, u), lemma) for f, u, lemma in dev_words)
    lemmatizer.predict(pairs, edits=False)  # builds the encoders of every length first
    found = {}
    for beam in (1, 2, 4):
        start = time.perf_counter()
        found[beam] = lemmatizer.predict(pairs, beam=beam, edits=False)
        speed = len(pairs) / (time.perf_counter() - start)
        right = np.mean([lemma == gold[p] for p, lemma in zip(pairs, found[beam])])
        same = np.mean([a == b for a, b in zip(found[1], found[beam])])
        print(f"{'greedy' if beam == 1 else f'beam {beam}'}: {speed:,.0f} words/s (seq2seq "
              f"alone {100 * right:.2f}% of {len(pairs)} dev pairs; {100 * same:.2f}% as "
              f"greedy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
