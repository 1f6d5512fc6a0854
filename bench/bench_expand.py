"""How long ``unroll.expand`` takes to unroll nets (the NetParameter only, no Net).

Prints seconds and layers for the tagger's nets at the lengths a training run
asks for first (T = 16, 32, 64 and 159, EWT's longest sentence; the example's
default sizes: two BiLSTM layers, a character LSTM), for the lstm step
template at T = 1,000 and 10,000, and for the two-layer BiLSTM tagger at
T = 2,000. Each is a first expansion (every case differs, so none is cached); the
time grows linearly with T (each step's text is parsed once per shape, never
printed and parsed again). A benchmark, not a test: run it on an idle machine.

    python -m bench.bench_expand            (from the repository root)
"""

from __future__ import annotations

import time

from unroll.frontend.unroller import expand

#: the tagger example's nets: TaggerConfig's defaults over EWT-sized vocabularies
TAGGER = dict(batch=32, vocab=20000, tags=17, embed=100, hidden=256, layers=2, cell="lstm",
              chars={"embed": 32, "hidden": 64, "length": 16, "vocab": 100}, char_columns=32,
              ignore_label=-1)
CASES = {
    **{f"tagger T={T}": ("tagger", dict(steps=T, **TAGGER)) for T in (16, 32, 64, 159)},
    "lstm T=1000": ("lstm", dict(steps=1000, batch=2, input_dim=3, hidden=4)),
    "lstm T=10000": ("lstm", dict(steps=10000, batch=2, input_dim=3, hidden=4)),
    "small tagger T=2000": ("tagger", dict(steps=2000, batch=2, vocab=7, tags=3, layers=2,
                                           hidden=4)),
}


def main() -> None:
    for label, (template, variables) in CASES.items():
        start = time.perf_counter()
        net_param = expand(template, **variables)
        seconds = time.perf_counter() - start
        print(f"expand {label}: {seconds:.3f} s, {len(net_param.layer):,} layers")


if __name__ == "__main__":
    main()
