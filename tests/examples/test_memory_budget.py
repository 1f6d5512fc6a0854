"""--memory-budget: the tagger trains in a memory budget, bit-identically (train.py)."""

import json

import pytest

from examples.pos_tagging.__main__ import build_parser
from unroll.engine import memory


def test_a_budget_trains_the_tagger_bit_identically(corpus, tmp_path, options, monkeypatch):
    from examples.pos_tagging.train import train

    plans = []
    within_budget = memory.within_budget

    def recording(*args, **kwargs):
        result = within_budget(*args, **kwargs)
        plans.append(result[0].recompute)
        return result

    runs = {}
    for budget in (None, 72_000):  # between the smallest plan and the full one of a batch
        if budget is not None:
            monkeypatch.setattr(memory, "within_budget", recording)
        sizes = dict(options(corpus, tmp_path).sizes, layers=2)
        train(options(corpus, tmp_path / str(budget), epochs=1, sizes=sizes,
                      memory_budget=budget))
        log = json.loads((tmp_path / str(budget) / "log.json").read_text())
        runs[budget] = ([(e["train_loss"], e["dev_accuracy"]) for e in log],
                        (tmp_path / str(budget) / "best.caffemodel").read_bytes())
    assert any(plan is not None and plan.recomputed for plan in plans)  # it did recompute
    assert runs[72_000] == runs[None]


def test_the_flag_reads_sizes_as_people_write_them():
    parser = build_parser()
    assert parser.parse_args(["train", "--memory-budget", "500MB"]).memory_budget == 500 * 10**6
    assert parser.parse_args(["train"]).memory_budget is None
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--memory-budget", "lots"])
