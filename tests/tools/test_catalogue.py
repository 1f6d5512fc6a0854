"""The layer catalogue: read off the layer classes, the site's Layers page equal to it."""

import json
from pathlib import Path

import pytest

from unroll import Net, expand
from unroll.core.proto import LayerParameter
from unroll.engine.layer import LAYERS, Layer
from unroll.frontend.caffe_export import caffe_layer_types
from unroll.tools import cli
from unroll.tools.catalogue import catalogue, markdown, readme_table, update_readme

#: the page that holds the generated layer table (written by `python -m docs.generate`)
LAYERS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "layers.md"


def test_the_layers_page_table_is_the_catalogue():
    assert readme_table(LAYERS_PAGE.read_text()) == markdown(), (
        "the layer table of docs/reference/layers.md differs from the layer classes; run "
        "`python -m docs.generate`")


def test_update_readme_writes_the_table_between_its_markers(tmp_path):
    readme = tmp_path / "layers.md"
    readme.write_text(LAYERS_PAGE.read_text().replace("| `Scale` |", "| `Scaled` |"))
    assert update_readme(readme)
    assert readme.read_text() == LAYERS_PAGE.read_text()
    assert not update_readme(readme)
    (tmp_path / "bare.md").write_text("# no table\n")
    with pytest.raises(ValueError, match="the README has no layer table"):
        update_readme(tmp_path / "bare.md")


def test_every_registered_type_is_listed_with_its_origin():
    assert {e.type for e in catalogue()} == set(LAYERS)
    entries = {e.type: e for e in catalogue(built_in=True)}
    for name, e in entries.items():
        assert e.caffe == (name in caffe_layer_types()), name
    assert {n for n, e in entries.items() if not e.caffe} == {
        "BatchMatMul", "EuclideanLossChunk", "GRUUnit", "LeadingSequenceEnd", "Scatter",
        "SegmentSum", "SoftmaxWithLossChunk", "TrailingSequenceEnd"}


def test_entries_are_the_class_attributes():
    e = {e.type: e for e in catalogue()}
    assert (e["ReLU"].in_place, e["ReLU"].backward_reads) == (True, "top")
    assert (e["Slice"].bottoms, e["Slice"].tops) == ("1", "1..any")
    assert (e["BatchReindex"].backward_reads, e["Input"].bottoms) == ("bottom 1", "0")
    assert e["Eltwise"].backward_reads.startswith("by params (SUM, MAX: nothing")
    assert e["LSTM"].bottoms == "2..3 (default params)"
    assert e["SoftmaxWithLoss"].param_messages == ("loss_param", "softmax_param")
    assert e["SoftmaxWithLoss"].is_loss and not e["Softmax"].is_loss
    assert e["BatchNorm"].state_blobs and not e["Scale"].state_blobs
    assert "check_host_bottom" in e["Embed"].hooks and "memory.passes_diff" in e["Eltwise"].hooks
    assert e["InnerProduct"].hooks == ("memory.batched_param_gradient",)
    assert e["ReLU"].hooks == ()
    assert e["InnerProduct"].summary.startswith("y = x W^T + b")


def test_every_parameter_message_is_a_layer_parameter_field():
    fields = LayerParameter.DESCRIPTOR.fields_by_name
    for e in catalogue():
        assert all(m in fields and m.endswith("_param") for m in e.param_messages), e.type


def built_nets():
    yield expand("tagger", steps=2, batch=2, vocab=5, tags=3, embed=2, hidden=2,
                 features={"suffix": [4, 2]}, chars={"vocab": 4, "embed": 2, "hidden": 2,
                                                     "length": 3})
    for cell in ("gru", "lstm", "rnn", "gru_primitive"):
        yield expand(cell, steps=2, input_dim=2, hidden=2, initial_state="learned")
    yield expand("siamese", steps=1, batch=2, input_dim=3, hidden=4, embed=2)
    for kind in ("LSTM", "RNN"):
        yield f"""
          layer {{ name: "in" type: "Input" top: "x" top: "cont" top: "s"
                  input_param {{ shape {{ dim: 2 dim: 1 dim: 3 }} shape {{ dim: 2 dim: 1 }}
                                shape {{ dim: 1 dim: 2 }} }} }}
          layer {{ name: "r" type: "{kind}" bottom: "x" bottom: "cont" bottom: "s" top: "h"
                  recurrent_param {{ num_output: 2 }} }}"""
    yield """
      layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
      layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" }
      layer { name: "sc" type: "Scale" bottom: "y" top: "z" scale_param { bias_term: true } }
      layer { name: "b" type: "Bias" bottom: "z" top: "w" }
      layer { name: "ip" type: "InnerProduct" bottom: "w" top: "v"
              inner_product_param { num_output: 2 } }"""


def test_learnable_blobs_declared_are_those_the_layers_make():
    made = {}
    for source in built_nets():
        for layer in Net(source, dtype="float64").layers:
            made.setdefault(layer.type, set()).add(len(layer.blobs))
    declared = {e.type: len(e.learnable_blobs) for e in catalogue(built_in=True)}
    for name, counts in made.items():
        assert max(counts) <= declared[name], (name, counts)
        assert (declared[name] == 0) == (counts == {0}), (name, counts)
    assert {"InnerProduct", "Embed", "Scale", "Bias", "BatchNorm", "LSTM", "RNN"} <= set(made)
    # every type that makes blobs was built here, with its options (bias_term, x_static)
    assert {n for n, k in declared.items() if k} <= set(made)


class Cube(Layer):
    """y = x ** 3, any shape."""

    in_place = True
    param_blobs = ("gain (1,)",)


def test_a_registered_layer_is_listed(monkeypatch):
    monkeypatch.setitem(LAYERS, "Cube", Cube)
    monkeypatch.setattr(Cube, "type", "Cube")
    cube = next(e for e in catalogue() if e.type == "Cube")
    assert (cube.caffe, cube.in_place, cube.learnable_blobs, cube.summary) == (
        False, True, ("gain (1,)",), "y = x ** 3, any shape.")


def test_unroll_layers_command(capsys):
    assert cli.main(["layers"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["TYPE", "CAFFE", "BOTTOMS"]
    assert len(lines) == 1 + len(LAYERS)
    gru = next(line for line in lines if line.startswith("GRUUnit "))
    assert gru.split()[:4] == ["GRUUnit", "unroll", "4", "1"]
    assert cli.main(["layers", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [e["type"] for e in listed] == sorted(LAYERS)
    ip = next(e for e in listed if e["type"] == "InnerProduct")
    assert ip["learnable_blobs"][0].startswith("weight") and ip["caffe"] is True


def test_doctests():
    import doctest

    import unroll.tools.catalogue

    assert doctest.testmod(unroll.tools.catalogue).failed == 0
