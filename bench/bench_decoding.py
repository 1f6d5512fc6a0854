"""The fixed cost of a decoder step, and decoding words/s of the lemmatizer through
``unroll.train.decoding``: greedy and beam search, every live hypothesis in one Stepper
call, the attention memory a static input.

First the µs per call (``--clock cpu``: CPU time, for a busy machine; ``wall``) of the
lemmatizer's decoder step at a batch of 1 and of 256: a ``StepperDecoder.step``, the
bare ``Net.forward`` of its Stepper with the same feed, and a one-layer net's forward
(the engine's own cost per run), so the decoder's own cost is the first figure less the
second. Then it trains the lemmatizer briefly (``--epochs`` over the first
``--sentences`` training sentences, ``--attention`` as the lemmatizer takes it), decodes
the distinct dev (form, UPOS) pairs that fit (``bench/bench_lemmatize.py``'s pairs and
batches, so its PyTorch twin's words/s compare) greedily and with beams of 2 and 4 from
the same encoder states, and prints words/s, the seq2seq's accuracy (decoder alone) and
how often each beam agrees with greedy decoding. A benchmark, not a test: run it on an
idle machine.

The CPU clock is for ONE thread. With two BLAS threads it also counts OpenBLAS's worker,
which spin-waits for its next GEMM through the decoder's Python and NumPy work between
products (50 rounds of a 256x512x1024 sgemm, then 20,000 additions in Python: at two
threads the worker burned 57 ms of CPU beside the main thread's 81 ms, on a busy 2-core
machine): words/s on the CPU clock then fall at two threads while the wall clock gains,
with no regression in the decoder. Compare two threads on the wall clock, idle.

    python -m bench.bench_decoding --epochs 1 --sentences 4000
    python -m bench.bench_decoding --epochs 3 --sentences 0   # bench_lemmatize's model
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.timing import least_us_per_call


def call_costs(lemmatizer, pairs, clock) -> None:
    """Print the µs per call of the decoder's step, its Stepper's Net.forward with the
    same feed, and a one-layer net's forward, as decoding calls them (one token a row)."""
    from unroll import Net

    tiny = Net('''layer { name: "in" type: "Input" top: "a" input_param { shape { dim: 1 } } }
                 layer { name: "p" type: "Power" bottom: "a" top: "b" }''')
    one = np.ones(1, np.float32)
    lengths = [len(form) for form, _ in pairs]
    common = max(set(lengths), key=lengths.count)
    words = [p for p in pairs if len(p[0]) == common]
    for batch in (1, 256):
        part = (words * (batch // len(words) + 1))[:batch]
        decoder = lemmatizer.decoder(lemmatizer.encode(part))
        tokens = np.full(batch, lemmatizer.bos)
        feed = {"tgt_in": np.full((1, batch), lemmatizer.bos, np.float32),
                "tgt_cont": np.ones((1, batch), np.float32), **decoder.static}
        state = {name: np.zeros((1, batch, *lemmatizer.stepper.declared[name][2:]), np.float32)
                 for name in lemmatizer.stepper.pairs}
        us = least_us_per_call({"step": lambda d=decoder, t=tokens: d.step(t),
                          "forward": lambda f=feed, s=state: lemmatizer.stepper.net.forward(
                              **f, **s),
                          "engine": lambda: tiny.forward(a=one)},
                                clock, max(50, 2000 // batch), rounds=7)
        print(f"batch {batch}: decoder step {us['step']:.1f} µs, its Net.forward "
              f"{us['forward']:.1f} µs (the decoding's own {us['step'] - us['forward']:.1f} µs), "
              f"a one-layer net's forward {us['engine']:.1f} µs")


def main(argv=None) -> int:
    from examples.lemmatize.model import ATTENTION, Lemmatizer, LemmatizerConfig

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="the folder of EWT's .conllu (default: as the tagger)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=4000,
                        help="training sentences (0: all, as bench_lemmatize)")
    parser.add_argument("--pairs", type=int, default=0,
                        help="dev pairs decoded (0: all that fit, as bench_lemmatize)")
    parser.add_argument("--attention", choices=ATTENTION, default=LemmatizerConfig.attention)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu: process CPU time (a busy machine, one thread: it counts "
                             "a spinning BLAS worker), wall: elapsed time")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    from examples.lemmatize.conll import read_lemmas
    from examples.lemmatize.train import words_of
    from unroll import Solver
    from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, data_dir

    data = data_dir(args.data)
    train_words = words_of(read_lemmas(data / TRAIN_FILE)[:args.sentences or None])
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
    pairs = sorted({(f, u) for f, u, _ in dev_words if lemmatizer.fits(f)})
    pairs = pairs[:args.pairs] if args.pairs else pairs
    call_costs(lemmatizer, pairs, clock)
    gold = dict(((f, u), lemma) for f, u, lemma in dev_words)
    lemmatizer.predict(pairs, edits=False)  # builds the encoders of every length first
    found = {}
    for beam in (1, 2, 4):
        start = clock()
        found[beam] = lemmatizer.predict(pairs, beam=beam, edits=False)
        speed = len(pairs) / (clock() - start)
        right = np.mean([lemma == gold[p] for p, lemma in zip(pairs, found[beam])])
        same = np.mean([a == b for a, b in zip(found[1], found[beam])])
        print(f"{'greedy' if beam == 1 else f'beam {beam}'}: {speed:,.0f} words/s, {args.clock} "
              f"time (seq2seq "
              f"alone {100 * right:.2f}% of {len(pairs)} dev pairs; {100 * same:.2f}% as "
              f"greedy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
