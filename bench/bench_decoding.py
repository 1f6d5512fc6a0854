"""The fixed cost of a Stepper call, and decoding words/s of the lemmatizer: its own
greedy and beam search against ``unroll.train.decoding``'s, which steps every live
hypothesis in one call.

First the µs per call (``--clock cpu``: CPU time, for a busy machine; ``wall``) of
the lemmatizer's decoder step: a Stepper call, the bare ``Net.forward`` it makes,
and a one-layer net's forward (the engine's own cost per run), at a batch of 1 and
of 256, so the Stepper's own cost is the first figure less the second. Then it
trains the lemmatizer briefly (``--epochs`` over the first ``--sentences`` training
sentences) and decodes the distinct dev (form, UPOS) pairs that fit, in batches of
256 of one length (``bench/bench_lemmatize.py``'s pairs and batches, so its PyTorch
twin's words/s compare), both ways from the same encoder states; it checks that both
find the same lemmas and prints words/s. A benchmark, not a test: run it at one
thread (``OPENBLAS_NUM_THREADS=1``) on an idle machine.

    python -m bench.bench_decoding --epochs 1 --sentences 4000
    python -m bench.bench_decoding --epochs 3 --sentences 0   # bench_lemmatize's model
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from unroll.train.decoding import StepperDecoder, beam_search, greedy


def library_predict(lemmatizer, pairs, beam: int, batch_size: int = 256) -> list[str]:
    """The lemmatizer's predict (without the edit classifier), decoded by the library."""
    from examples.lemmatize.model import UNK_ID

    out = [None] * len(pairs)
    by_length: dict = {}
    for i, (form, _) in enumerate(pairs):
        by_length.setdefault(len(form) + 1, []).append(i)
    decoder = StepperDecoder(lemmatizer.stepper, token="tgt_in", cont="tgt_cont",
                             output="probs")
    for length, index in sorted(by_length.items()):
        for k in range(0, len(index), batch_size):
            part = index[k:k + batch_size]
            n = len(part)
            src = np.array([lemmatizer.source(*pairs[i]) for i in part], float).T
            cont = np.ones((length, n))
            cont[0] = 0
            zeros = np.zeros((1, n, lemmatizer.config.hidden))
            enc = lemmatizer.encoders.forward(
                widths=length, src=src, src_cont=cont, enc_fw_h_0=zeros, enc_fw_c_0=zeros,
                enc_bw_h_0=zeros, enc_bw_c_0=zeros, blobs=["dec_h_init"])
            decoder.start({"dec_h_0": np.asarray(enc["dec_h_init"]).copy(),
                           "dec_c_0": np.asarray(enc["dec_c_init"]).copy()})
            max_len = max(len(pairs[i][0]) for i in part) + 10
            args = (decoder, n, lemmatizer.bos, lemmatizer.eos, max_len)
            found = greedy(*args) if beam == 1 else beam_search(*args, beam=beam)
            for i, (tokens, _) in zip(part, found):
                out[i] = "".join(lemmatizer.chars.itos[t] if t != UNK_ID else "?"
                                 for t in tokens)
    return out


def per_call_us(runs: dict, clock, calls: int, rounds: int = 7) -> dict:
    """{name: the least over ``rounds`` of the mean µs per call of ``runs[name]``}, the
    rounds of the runs taken in turns, so a busy machine slows each alike (the least: the
    round its other work slowed down least)."""
    best = dict.fromkeys(runs, float("inf"))
    for run in runs.values():
        for _ in range(20):
            run()
    for _ in range(rounds):
        for name, run in runs.items():
            start = clock()
            for _ in range(calls):
                run()
            best[name] = min(best[name], (clock() - start) / calls * 1e6)
    return best


def call_costs(lemmatizer, clock) -> None:
    """Print the µs per call of the decoder's Stepper, its Net.forward, and a one-layer
    net's forward, from given states, as decoding calls them (cont 1, one token a row)."""
    from unroll import Net

    stepper = lemmatizer.stepper
    tiny = Net('''layer { name: "in" type: "Input" top: "a" input_param { shape { dim: 1 } } }
                 layer { name: "p" type: "Power" bottom: "a" top: "b" }''')
    one = np.ones(1, np.float32)
    for batch in (1, 256):
        feed = {"tgt_in": np.full((1, batch), lemmatizer.bos, np.float32),
                "tgt_cont": np.ones((1, batch), np.float32)}
        state = {name: np.zeros((1, batch, *stepper.declared[name][2:]), np.float32)
                 for name in stepper.pairs}
        stepper.reset(state)
        us = per_call_us({"call": lambda feed=feed: stepper(**feed),
                          "forward": lambda feed=feed, state=state: stepper.net.forward(
                              **feed, **state),
                          "engine": lambda: tiny.forward(a=one)}, clock, max(50, 2000 // batch))
        print(f"batch {batch}: Stepper call {us['call']:.1f} µs, its Net.forward "
              f"{us['forward']:.1f} µs (the Stepper's own {us['call'] - us['forward']:.1f} µs), "
              f"a one-layer net's forward {us['engine']:.1f} µs")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="the folder of EWT's .conllu (default: as the tagger)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=4000,
                        help="training sentences (0: all, as bench_lemmatize)")
    parser.add_argument("--pairs", type=int, default=0,
                        help="dev pairs decoded (0: all that fit, as bench_lemmatize)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu: process CPU time (a busy machine), wall: elapsed time")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    from examples.lemmatize.conll import read_lemmas
    from examples.lemmatize.model import Lemmatizer, LemmatizerConfig
    from examples.lemmatize.train import words_of
    from unroll import Solver
    from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, data_dir

    data = data_dir(args.data)
    train_words = words_of(read_lemmas(data / TRAIN_FILE)[:args.sentences or None])
    dev_words = words_of(read_lemmas(data / DEV_FILE))
    lemmatizer = Lemmatizer.build(train_words, LemmatizerConfig(), seed=0)
    call_costs(lemmatizer, clock)
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
    gold = dict(((f, u), lemma) for f, u, lemma in dev_words)
    lemmatizer.predict(pairs, edits=False)  # builds the encoders of every length first
    for beam in (1, 4):
        timed = {}
        for side, run in (("examples/lemmatize/decode.py (every row, every step)",
                           lambda beam=beam: lemmatizer.predict(pairs, beam=beam, edits=False)),
                          ("unroll.train.decoding (every live hypothesis in one call)",
                           lambda beam=beam: library_predict(lemmatizer, pairs, beam))):
            start = clock()
            lemmas = run()
            timed[side] = (len(pairs) / (clock() - start), lemmas)
        same = np.mean([a == b for a, b in zip(*(lemmas for _, lemmas in timed.values()))])
        for side, (speed, lemmas) in timed.items():
            right = np.mean([lemma == gold[p] for p, lemma in zip(pairs, lemmas)])
            print(f"{'greedy' if beam == 1 else f'beam {beam}'}: {side}: {speed:,.0f} words/s "
                  f"({args.clock} time) "
                  f"(seq2seq alone {100 * right:.2f}% of {len(pairs)} dev pairs)")
        print(f"  the two agree on {100 * same:.2f}% of the lemmas")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
