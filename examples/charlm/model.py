"""The character LM: its symbols (EWT's text as one stream: a boundary, then each sentence
followed by one) and its nets over one parameter store (``charlm.prototxt.j2`` has the
equations): one per window length to train (a pass's last window may be shorter), their
test-phase twins to score, and a one-step net that an :class:`unroll.Stepper` runs to
sample. Each window carries on from the state of the one before (truncated BPTT,
docs/design.md "Unrolling").

>>> Symbols.build(["ab", "b"]).stream(["ab", "b"]).tolist()   # <unk> 0, boundary 1, a 2, b 3
[1, 2, 3, 1, 3, 1]
>>> lm = CharLM(Symbols.build(["a cat", "a dog"]), CharLMConfig(4, 8, batch=2, steps=3))
>>> lm.sample("a ", length=5, seed=1).startswith("a ")
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from unroll import BucketedModel, Stepper, carry_hidden, expand
from unroll.engine.backend import to_numpy
from unroll.train.bptt_windows import bptt_windows
from unroll.train.trainer import TrainingDiverged

UNK, BOUNDARY, IGNORE = "<unk>", "\n", -1
TEMPLATE = Path(__file__).with_name("charlm.prototxt.j2")
#: the SolverParameter fields of training (bench/bench_charlm.py gives PyTorch the same)
SOLVER = {"type": "Adam", "base_lr": 2e-3, "momentum": 0.9, "momentum2": 0.999, "delta": 1e-8,
          "clip_gradients": 5.0}


class Symbols:
    """The symbol table: <unk>, the boundary, then the training text's characters."""

    def __init__(self, itos):
        self.itos, self.stoi = list(itos), {s: i for i, s in enumerate(itos)}

    @classmethod
    def build(cls, texts) -> Symbols:
        return cls([UNK, BOUNDARY, *sorted(set().union(*map(set, texts)) - {BOUNDARY})])

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.stoi.get(c, 0) for c in text], np.int64)

    def stream(self, texts) -> np.ndarray:
        return self.encode(BOUNDARY + "".join(t + BOUNDARY for t in texts))


@dataclass
class CharLMConfig:
    """Sizes: the embedding, the LSTM, N rows (streams) and T steps a window; and the
    learning rate the model is trained with."""

    embed: int = 64
    hidden: int = 256
    batch: int = 32
    steps: int = 100
    lr: float = SOLVER["base_lr"]


class CharLM:
    """The nets of one character LM over one parameter store (``train_model.store``)."""

    def __init__(self, symbols: Symbols, config: CharLMConfig, seed: int = 0,
                 memory_budget: int | None = None, device: str = "cpu"):
        self.symbols, self.config = symbols, config

        def net(steps, part="train", batch=config.batch):
            return expand(TEMPLATE, steps=steps, batch=batch, symbols=len(symbols.itos),
                          part=part, embed=config.embed, hidden=config.hidden,
                          ignore_label=IGNORE)

        self.train_model = BucketedModel(net, seed=seed, memory_budget=memory_budget,
                                         device=device)
        self.test_model = BucketedModel(net, phase="test", device=device,
                                        store=self.train_model.store,
                                        net_params=self.train_model.net_params)
        self.stepper = Stepper(net(1, "step", 1), store=self.train_model.store, device=device)

    def windows(self, texts) -> list:
        """The (inputs, targets) windows of ``texts`` as one stream (:class:`Symbols`)."""
        return bptt_windows(self.symbols.stream(texts), self.config.batch, self.config.steps,
                            IGNORE)

    def zero_state(self) -> dict:
        zeros = np.zeros((1, self.config.batch, self.config.hidden), np.float32)
        return {"h_0": zeros, "c_0": zeros}

    @staticmethod
    def inputs(window, state: dict) -> dict:
        """A window's inputs, carrying on from ``state`` ({"h_0": ..., "c_0": ...})."""
        return {"chars": window[0], "cont": np.ones(window[0].shape), "next": window[1],
                **state}

    def bits_per_char(self, texts) -> float:
        """The mean cross-entropy in bits (nats / ln 2) of each symbol of the stream of
        ``texts`` given those before it, the state carried through every window."""
        state, nats, count = self.zero_state(), 0.0, 0
        for window in self.windows(texts):
            loss = self.test_model.forward(**self.inputs(window, state))["loss"]
            valid = int(np.count_nonzero(window[1] != IGNORE))
            nats, count = nats + float(loss) * valid, count + valid
            state = carry_hidden(self.test_model)
        return nats / max(count, 1) / math.log(2)

    def sample(self, prime: str = "", length: int = 200, temperature: float = 1.0,
               seed: int = 0) -> str:
        """``prime`` and what follows it, drawn symbol by symbol at ``temperature`` from a
        generator seeded with ``seed``, up to ``length`` symbols or the sentence's end."""
        if not temperature > 0:
            raise ValueError(f"temperature: expected a number > 0, found {temperature}")
        rng, text, one = np.random.default_rng(seed), list(prime), np.ones((1, 1))

        def step(k):  # the next symbol's probabilities, after reading symbol k
            p = to_numpy(self.stepper(chars=one * k, cont=one)["probs"])[0, 0].astype(float)
            if not np.isfinite(p).all():
                raise TrainingDiverged("the model's probabilities are not finite (its weights "
                                       "diverged); train it again with a lower --lr")
            return p

        self.stepper.reset()
        for k in self.symbols.encode(BOUNDARY + prime):
            probs = step(k)
        while len(text) < len(prime) + length:
            p = np.exp((np.log(probs + 1e-300) - np.log(probs.max() + 1e-300)) / temperature)
            k = int(rng.choice(len(p), p=p / p.sum()))
            if self.symbols.itos[k] == BOUNDARY:
                break
            text.append(self.symbols.itos[k])
            probs = step(k)
        return "".join(text)
