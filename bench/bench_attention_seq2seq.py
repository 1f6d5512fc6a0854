"""The attention seq2seq a new user writes: reverse words of 8-20 random letters.

An LSTM encoder over the source; an LSTM decoder with Luong dot attention over the
encoder's outputs (the built-in ``lstm_attention`` step, in
``bench/attention_seq2seq.prototxt.j2``), started from the encoder's final states;
teacher forcing, a softmax loss, Adam; greedy decoding over a Stepper of the decoder
step (``unroll.train.decoding``), the memory given as static inputs. Sources are
right-aligned in S = 20 steps (cont 0 up to a word's first letter, so the encoder's
final state is the word's), the padding masked out of the attention (-1e9); targets
are the letters reversed, then EOS, padded with the ignore label.

Prints, per epoch, seconds of training, the mean training loss, and the exact match
of greedy decoding on held-out words (and their sequences per second). ``--side torch``
(run by a Python with torch) trains the same model as a PyTorch user writes it, from its
own initialisation, on the same words: ``nn.Embedding``, an ``nn.LSTM`` encoder over
left-aligned packed sources, an ``nn.LSTM`` decoder from its final states, the same
attention (``bmm`` scores, masked softmax, ``tanh(W_c [c; h])``), ``nn.Linear``,
``CrossEntropyLoss``, Adam, greedy decoding step by step. A benchmark, not a test.

    python -m bench.bench_attention_seq2seq --epochs 4
    PATH/TO/torch/venv/bin/python bench/bench_attention_seq2seq.py --side torch
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

TEMPLATE = Path(__file__).with_name("attention_seq2seq.prototxt.j2")
LETTERS, BOS, EOS = 26, 26, 27
VOCAB, S, T = 28, 20, 21


def words(rng, count):
    return [rng.integers(0, LETTERS, rng.integers(8, 21)) for _ in range(count)]


def source(batch):
    """src (S, N) right-aligned, its cont (0 up to each word's first letter) and mask."""
    N = len(batch)
    src, cont, mask = np.zeros((S, N)), np.ones((S, N)), np.zeros((S, N))
    for n, w in enumerate(batch):
        start = S - len(w)
        src[start:, n] = w
        cont[: start + 1, n] = 0
        mask[:start, n] = -1e9
    return src, cont, mask


def feeds(batch, H):
    src, src_cont, mask = source(batch)
    N = len(batch)
    tgt_in, tgt_out = np.full((T, N), EOS, float), np.full((T, N), -1.0)
    for n, w in enumerate(batch):
        out = np.concatenate([w[::-1], [EOS]])
        tgt_out[: len(out), n] = out
        tgt_in[0, n] = BOS
        tgt_in[1: len(out), n] = out[:-1]
    zeros = np.zeros((1, N, H))
    return dict(src=src, src_cont=src_cont, src_mask=mask, tgt_in=tgt_in,
                tgt_cont=np.ones((T, N)), tgt_out=tgt_out, enc_h_0=zeros, enc_c_0=zeros)


def torch_side(args) -> int:
    import torch
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    H, N, E = args.hidden, args.batch, 32

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.src, self.tgt = nn.Embedding(VOCAB, E), nn.Embedding(VOCAB, E)
            self.enc, self.dec = nn.LSTM(E, H), nn.LSTM(E, H)
            self.combine = nn.Linear(2 * H, H, bias=False)
            self.out = nn.Linear(H, VOCAB)

        def encode(self, batch):
            lengths = torch.tensor([len(w) for w in batch])
            src = torch.zeros(S, len(batch), dtype=torch.long)
            for n, w in enumerate(batch):
                src[: len(w), n] = torch.from_numpy(w)
            packed = pack_padded_sequence(self.src(src), lengths, enforce_sorted=False)
            memory, state = self.enc(packed)
            memory, _ = pad_packed_sequence(memory, total_length=S)
            pad = torch.arange(S)[:, None] >= lengths[None]
            return memory, pad, state

        def decode(self, tokens, memory, pad, state):
            h, state = self.dec(self.tgt(tokens), state)             # (T, N, H)
            scores = torch.einsum("snh,tnh->tns", memory, h).masked_fill(pad.T[None], -1e9)
            context = torch.einsum("tns,snh->tnh", scores.softmax(-1), memory)
            a = torch.tanh(self.combine(torch.cat([context, h], -1)))
            return self.out(a), state

    model = Seq2Seq()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss(ignore_index=-1)
    rng = np.random.default_rng(0)
    train, test = words(rng, args.train), words(rng, args.test)
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} thread(s): the same model")
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(train))
        start, losses = time.perf_counter(), []
        for b in range(0, len(order) - N + 1, N):
            batch = [train[i] for i in order[b:b + N]]
            f = feeds(batch, H)
            memory, pad, state = model.encode(batch)
            scores, _ = model.decode(torch.from_numpy(f["tgt_in"]).long(), memory, pad, state)
            loss = loss_fn(scores.reshape(-1, VOCAB),
                           torch.from_numpy(f["tgt_out"]).long().reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        with torch.no_grad():
            memory, pad, state = model.encode(test)
            tokens = torch.full((1, len(test)), BOS)
            out, done = [], torch.zeros(len(test), dtype=torch.bool)
            for _ in range(T):
                scores, state = model.decode(tokens, memory, pad, state)
                tokens = scores.argmax(-1)
                out.append(tokens[0])
                done |= tokens[0] == EOS
                if done.all():
                    break
        decode_seconds = time.perf_counter() - start
        out = torch.stack(out).T.tolist()
        decoded = [row[: row.index(EOS)] if EOS in row else row for row in out]
        exact = np.mean([tokens == list(w[::-1]) for tokens, w in zip(decoded, test)])
        print(f"epoch {epoch}: {seconds:.1f} s training, loss {np.mean(losses):.4f}; exact match "
              f"{100 * exact:.1f}%, greedy {args.test / decode_seconds:.0f} sequences/s")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train", type=int, default=3200, help="training words")
    parser.add_argument("--test", type=int, default=256, help="held-out words")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--side", choices=["unroll", "torch"], default="unroll")
    args = parser.parse_args(argv)
    if args.side == "torch":
        return torch_side(args)
    import unroll
    from unroll.train.decoding import StepperDecoder, greedy

    H, N = args.hidden, args.batch
    rng = np.random.default_rng(0)
    train, test = words(rng, args.train), words(rng, args.test)

    def expand(part, steps, batch):
        return unroll.expand(TEMPLATE, steps=steps, batch=batch, src_steps=S, vocab=VOCAB,
                             hidden=H, part=part)

    net = unroll.Net(expand("train", T, N))
    solver = unroll.Solver(net, type="Adam", base_lr=args.lr, momentum=0.9, momentum2=0.999,
                           delta=1e-8)
    encoder = unroll.Net(expand("encode", 1, args.test), phase="test", param_store=net.store)
    stepper = unroll.Stepper(expand("step", 1, args.test), store=net.store)
    print(f"reverse {args.train} words of 8-20 letters (S={S}, T={T}, N={N}, H={H}), "
          f"LSTM encoder -> LSTM decoder with dot attention, Adam lr {args.lr}; "
          f"exact match of greedy decoding on {args.test} held-out words")
    test_src, test_cont, test_mask = source(test)
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(train))
        start, losses = time.perf_counter(), []
        for b in range(0, len(order) - N + 1, N):
            losses.append(solver.step(1, feed=feeds([train[i] for i in order[b:b + N]], H)))
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        zeros = np.zeros((1, args.test, H))
        out = encoder.forward(src=test_src, src_cont=test_cont, enc_h_0=zeros, enc_c_0=zeros)
        decoder = StepperDecoder(stepper, token="tgt_in", cont="tgt_cont", output="probs",
                                 static={"enc": out["enc"], "src_mask": test_mask},
                                 batch_axes={"src_mask": 1})
        decoder.start({"dec_h_0": out["enc_h_T"], "dec_c_0": out["enc_c_T"]})
        decoded = greedy(decoder, args.test, BOS, EOS, max_len=T)
        decode_seconds = time.perf_counter() - start
        exact = np.mean([list(tokens) == list(w[::-1]) for (tokens, _), w in zip(decoded, test)])
        print(f"epoch {epoch}: {seconds:.1f} s training, loss {np.mean(losses):.4f}; exact match "
              f"{100 * exact:.1f}%, greedy {args.test / decode_seconds:.0f} sequences/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
