"""A memory budget given to a Net, a BucketedModel or `unroll memory --budget` is read by
one parser, unroll.core.sizes (docs/design.md, 3): the same spellings, the same refusals."""

import math

import pytest

from unroll.core.sizes import byte_size
from unroll.engine.net import Net
from unroll.tools import cli
from unroll.train.bucketed_model import BucketedModel

NET = 'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }'


@pytest.mark.parametrize("budget", ["500MB", 2e9, 10**9])
def test_a_net_and_a_bucketed_model_take_a_budget_as_a_size(budget):
    assert Net(NET, memory_budget=budget).memory_budget == byte_size(budget)
    model = BucketedModel(lambda T: NET, steps_from="x", memory_budget=budget)
    assert model.memory_budget == byte_size(budget)


@pytest.mark.parametrize("budget", [math.nan, -1, "junk"])
def test_a_net_and_a_bucketed_model_refuse_a_budget_that_is_no_size(budget):
    with pytest.raises(ValueError, match="^memory_budget: expected a number of bytes"):
        Net(NET, memory_budget=budget)
    with pytest.raises(ValueError, match="^memory_budget: expected a number of bytes"):
        BucketedModel(lambda T: NET, steps_from="x", memory_budget=budget)


@pytest.mark.parametrize("budget", ["nan", "-3", "junk", "inf"])
def test_unroll_memory_refuses_a_budget_that_is_no_size(tmp_path, capsys, budget):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    with pytest.raises(SystemExit) as e:
        cli.main(["memory", str(path), f"--budget={budget}"])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after argparse's usage
    assert last.startswith("unroll memory: error: argument --budget: expected a number of bytes")
    assert last.endswith(f"found {budget!r}")
