"""The options every benchmark of one net states alike: its description and the net's size."""

from __future__ import annotations

import argparse


def net_size_parser(doc: str, *, steps: int, batch: int, hidden: int) -> argparse.ArgumentParser:
    """A parser described by ``doc`` as written (a module's docstring, its example lines
    kept), with the net's size: ``--steps`` (T), ``--batch`` (N) and ``--hidden`` (H), these
    their defaults; the script adds the options of its own.

    >>> args = net_size_parser("A bench.", steps=25, batch=32, hidden=128).parse_args(
    ...     ["--steps", "5"])
    >>> args.steps, args.batch, args.hidden
    (5, 32, 128)
    """
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=steps, help="T (default %(default)s)")
    parser.add_argument("--batch", type=int, default=batch, help="N (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=hidden, help="H (default %(default)s)")
    return parser
