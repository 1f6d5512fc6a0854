"""How long ``unroll.expand`` takes to unroll long nets (the NetParameter only, no Net).

Prints seconds and layers for the lstm step template at T = 10,000 and the
two-layer BiLSTM tagger at T = 2,000; the time grows linearly with T (each
step's text is parsed once per shape, never printed and parsed again). A
benchmark, not a test: run it on an idle machine.

    python -m bench.bench_expand            (from the repository root)
"""

from __future__ import annotations

import time

from unroll.frontend.unroller import expand

CASES = {
    "lstm T=10000": ("lstm", dict(steps=10000, batch=2, input_dim=3, hidden=4)),
    "tagger T=2000": ("tagger", dict(steps=2000, batch=2, vocab=7, tags=3, layers=2, hidden=4)),
}


def main() -> None:
    for label, (template, variables) in CASES.items():
        start = time.perf_counter()
        net_param = expand(template, **variables)
        seconds = time.perf_counter() - start
        print(f"expand {label}: {seconds:.2f} s, {len(net_param.layer):,} layers")


if __name__ == "__main__":
    main()
