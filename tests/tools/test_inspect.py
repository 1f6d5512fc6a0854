"""net.inspect() and `unroll inspect` against the net's real owners and decisions."""

import json
from collections import Counter

import numpy as np
import pytest

import unroll
from unroll.tools import cli

TEMPLATES = [("rnn", {}), ("lstm", {}), ("lstm_primitive", {}), ("gru", {}),
             ("lstm", {"direction": "bidirectional", "layers": 2}),
             ("gru", {"initial_state": "learned"})]


def holders(net) -> Counter:
    """How many layers hold each learnable param, found from memory: a holder's blob IS the
    owner's data or a view of it."""
    count = Counter()
    for p in net.learnable_params:
        count[p.name] = sum(any(np.shares_memory(b.data, p.blob.data) for b in layer.blobs)
                            for layer in net.layers)
    return count


@pytest.mark.parametrize("template, options", TEMPLATES)
def test_params_name_their_real_owner_and_every_holder(template, options):
    T = 4
    net = unroll.Net(unroll.expand(template, steps=T, batch=2, input_dim=3, hidden=5, **options))
    report = net.inspect()
    assert [p.name for p in report.params] == [p.name for p in net.learnable_params]
    count = holders(net)
    for info, param in zip(report.params, net.learnable_params):
        assert info.owner == param.owner
        assert info.holders == count[param.name]
        assert info.shape == param.blob.shape and info.count == param.blob.count
        assert info.bytes == param.blob.data.nbytes
        assert not info.frozen
    # the recurrent weight is held by one layer per step; the input projection by one
    recurrent = [p for p in report.params if p.name.endswith(("W_hc", "W_hh", "W_h"))]
    assert recurrent and all(p.holders == T for p in recurrent)
    splits = [layer for layer in net.layers_run if layer.type == "Split"]
    assert [name for name, _, _ in report.splits] == [layer.name for layer in splits]
    assert [n for _, _, n in report.splits] == [len(layer.param.top) for layer in splits]


def test_in_place_decisions_and_their_reasons():
    net = unroll.Net('''
      layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
      layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
              param { lr_mult: 0 } inner_product_param { num_output: 3 } }
      layer { name: "relu" type: "ReLU" bottom: "y" top: "y" }
      layer { name: "tanh" type: "TanH" bottom: "y" top: "z" }
      layer { name: "sig" type: "Sigmoid" bottom: "z" top: "z" }''')
    report = net.inspect()
    assert report.in_place == [("relu", "y")]
    assert report.out_of_place == net.in_place_fallbacks
    assert len(report.out_of_place) == 1 and "'sig'" in report.out_of_place[0]
    assert "TanH" in report.out_of_place[0]  # why: tanh's backward reads its top
    frozen = {p.name: p.frozen for p in report.params}
    assert frozen == {"ip.0": True, "ip.1": False}
    assert report.memory.planned == net.memory_report().planned
    text = str(report)
    for part in ("ip.0", "frozen", "relu (y)", "given memory of their own: 1", "memory:"):
        assert part in text


def test_the_tagger_inspected_in_both_phases():
    make = dict(steps=6, batch=2, vocab=30, tags=5, embed=4, hidden=3, layers=2,
                chars={"vocab": 12, "embed": 2, "hidden": 2, "length": 4})
    train = unroll.Net(unroll.expand("tagger", **make))
    test = unroll.Net(unroll.expand("tagger", **make), phase="test", param_store=train.store)
    for net in (train, test):
        report = net.inspect()
        count = holders(net)
        assert {p.name: p.holders for p in report.params} == {
            p.name: count[p.name] for p in net.learnable_params}
    # the test phase plans nothing for backward: less memory for the same net
    assert test.inspect().memory.planned < train.inspect().memory.planned


def test_the_command_prints_a_table_or_json(capsys, tmp_path):
    args = ["lstm", "--steps", "3", "--set", "batch=2", "--set", "input_dim=3",
            "--set", "hidden=4"]
    assert cli.main(["inspect", *args]) == 0
    assert "W_hc" in capsys.readouterr().out
    assert cli.main(["inspect", *args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    net = unroll.Net(unroll.expand("lstm", steps=3, batch=2, input_dim=3, hidden=4))
    assert data == json.loads(json.dumps(net.inspect().as_dict()))
    assert cli.main(["inspect", "lstm"]) == 2
    assert "needs --steps" in capsys.readouterr().err


def test_a_caffe_lstm_prototxt_is_inspected_as_written_or_unrolled(capsys, tmp_path):
    path = tmp_path / "caffe_lstm.prototxt"
    path.write_text('''
      layer { name: "in" type: "Input" top: "x" top: "cont"
              input_param { shape { dim: 4 dim: 2 dim: 3 } shape { dim: 4 dim: 2 } } }
      layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
              recurrent_param { num_output: 5 } }''')
    assert cli.main(["inspect", str(path), "--json"]) == 0
    as_written = json.loads(capsys.readouterr().out)
    assert [p["holders"] for p in as_written["params"]] == [1, 1, 1]  # one LSTM layer
    assert cli.main(["inspect", str(path), "--steps", "6", "--json"]) == 0
    unrolled = json.loads(capsys.readouterr().out)
    assert max(p["holders"] for p in unrolled["params"]) == 6  # W_hc, once per step


@pytest.mark.parametrize("template, options", TEMPLATES)
def test_inspect_names_the_param_gradients_computed_in_one_gemm(template, options):
    T = 4
    net_param = unroll.expand(template, steps=T, batch=2, input_dim=3, hidden=5, **options)
    net_param.force_backward = True
    report = unroll.Net(net_param).inspect()
    recurrent = [p.name for p in report.params if p.name.endswith(("W_hc", "W_hh", "W_h"))]
    assert report.batched_gradients == {name: T for name in recurrent}
    assert report.as_dict()["batched_gradients"] == report.batched_gradients
    assert f"{recurrent[0]} over {T} layers" in str(report)
    # a net that runs no backward computes no gradient at all
    assert unroll.Net(unroll.expand(template, steps=T, batch=2, input_dim=3, hidden=5,
                                    **options)).inspect().batched_gradients == {}
