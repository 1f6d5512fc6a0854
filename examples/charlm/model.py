"""The character LM: its nets over one parameter store, bits per character, and sampling.

The net is ``charlm.prototxt.j2`` beside this file (read it for the equations).
Training runs the windows of the stream in order, each window's final states
carried into the next (truncated BPTT, ``docs/design.md`` "Unrolling"): one net
per window length (the last window of a pass may be shorter), all over one store;
a test-phase twin scores dev, and an :class:`unroll.Stepper` over the one-step net
samples.

>>> from examples.charlm.text import Symbols
>>> lm = CharLM(Symbols.build(["a cat", "a dog"]), CharLMConfig(embed=4, hidden=8, batch=2,
...                                                             steps=3))
>>> len(lm.sample("a ", length=5, seed=1)) <= 7
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from examples.charlm.text import BOUNDARY, IGNORE, Symbols, windows
from unroll import BucketedModel, Stepper, carry_hidden, expand

__all__ = ["SOLVER", "CharLM", "CharLMConfig"]

TEMPLATE = Path(__file__).with_name("charlm.prototxt.j2")
#: the SolverParameter fields of training (bench/bench_charlm.py gives PyTorch the same)
SOLVER = {"type": "Adam", "base_lr": 2e-3, "momentum": 0.9, "momentum2": 0.999, "delta": 1e-8,
          "clip_gradients": 5.0}


@dataclass
class CharLMConfig:
    """Sizes: the embedding, the LSTM, N rows (streams) and T steps a window."""

    embed: int = 64
    hidden: int = 256
    batch: int = 32
    steps: int = 100


class CharLM:
    """The nets of one character LM over one parameter store (``train_model.store``)."""

    def __init__(self, symbols: Symbols, config: CharLMConfig, seed: int = 0,
                 memory_budget: int | None = None):
        self.symbols, self.config = symbols, config
        self.train_model = BucketedModel(lambda t: self._net("train", t), seed=seed,
                                         memory_budget=memory_budget)
        self.test_model = BucketedModel(lambda t: self._net("train", t), phase="test",
                                        store=self.train_model.store,
                                        net_params=self.train_model.net_params)
        self.stepper = Stepper(self._net("step", 1, batch=1), store=self.train_model.store)

    def _net(self, part: str, steps: int, batch: int | None = None):
        c = self.config
        return expand(TEMPLATE, steps=steps, batch=batch or c.batch, symbols=len(self.symbols),
                      embed=c.embed, hidden=c.hidden, part=part, ignore_label=IGNORE)

    def windows(self, texts) -> list:
        """The (inputs, targets) windows of ``texts`` as one stream (:mod:`.text`)."""
        return windows(self.symbols.stream(texts), self.config.batch, self.config.steps)

    def zero_state(self) -> dict:
        zeros = np.zeros((1, self.config.batch, self.config.hidden), np.float32)
        return {"h_0": zeros, "c_0": zeros}

    @staticmethod
    def inputs(window, state: dict) -> dict:
        """A window's inputs, starting from ``state`` ({h_0, c_0}, the states it carries on)."""
        chars, targets = window
        return {"chars": chars, "cont": np.ones(chars.shape), "next": targets, **state}

    def bits_per_char(self, texts) -> float:
        """Mean cross-entropy, in bits, of each symbol of the stream of ``texts`` given those
        before it: nats / ln 2 over every window, the state carried through."""
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
        rng = np.random.default_rng(seed)
        self.stepper.reset()
        one = np.ones((1, 1))
        for k in self.symbols.encode(BOUNDARY + prime):
            probs = self.stepper(chars=one * k, cont=one)["probs"]
        out = []
        for _ in range(length):
            logits = np.log(np.maximum(probs[0, 0].astype(np.float64), 1e-300)) / temperature
            p = np.exp(logits - logits.max())
            k = int(rng.choice(len(p), p=p / p.sum()))
            if self.symbols.itos[k] == BOUNDARY:
                break
            out.append(self.symbols.itos[k])
            probs = self.stepper(chars=one * k, cont=one)["probs"]
        return prime + "".join(out)
