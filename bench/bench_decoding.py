"""Decoding words/s of the lemmatizer: its own greedy and beam search against
``unroll.train.decoding``'s, which steps only the live hypotheses.

Trains the lemmatizer of ``examples/lemmatize`` briefly (``--epochs`` over the first
``--sentences`` training sentences), then decodes the distinct dev (form, UPOS) pairs
both ways from the same encoder states, checks that both find the same lemmas, and
prints words/s. A benchmark, not a test: run it on an idle machine.

    python -m bench.bench_decoding --epochs 1 --sentences 4000
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="the folder of EWT's .conllu (default: as the tagger)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--pairs", type=int, default=2000, help="dev pairs decoded")
    args = parser.parse_args(argv)

    from examples.pos_tagging.data import data_dir

    from examples.lemmatize.conll import read_lemmas
    from examples.lemmatize.model import Lemmatizer, LemmatizerConfig
    from examples.lemmatize.train import DEV_FILE, TRAIN_FILE, words_of
    from unroll import Solver

    data = data_dir(args.data)
    train_words = words_of(read_lemmas(data / TRAIN_FILE)[:args.sentences])
    dev_words = words_of(read_lemmas(data / DEV_FILE))
    lemmatizer = Lemmatizer.build(train_words, LemmatizerConfig(), seed=0)
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
    for beam in (1, 4):
        timed = {}
        for side, run in (("examples/lemmatize/decode.py (every row, every step)",
                           lambda beam=beam: lemmatizer.predict(pairs, beam=beam, edits=False)),
                          ("unroll.train.decoding (live hypotheses only)",
                           lambda beam=beam: library_predict(lemmatizer, pairs, beam))):
            start = time.perf_counter()
            lemmas = run()
            timed[side] = (len(pairs) / (time.perf_counter() - start), lemmas)
        same = np.mean([a == b for a, b in zip(*(lemmas for _, lemmas in timed.values()))])
        for side, (speed, lemmas) in timed.items():
            right = np.mean([lemma == gold[p] for p, lemma in zip(pairs, lemmas)])
            print(f"{'greedy' if beam == 1 else f'beam {beam}'}: {side}: {speed:,.0f} words/s "
                  f"(seq2seq alone {100 * right:.2f}% of {len(pairs)} dev pairs)")
        print(f"  the two agree on {100 * same:.2f}% of the lemmas")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
