"""One way to expand (docs/design.md, 3. Unrolling): steps, nets, shared modules and trees
go through ``expand``, with one cache, one render budget and one set of checks."""

import numpy as np
import pytest

import unroll.frontend.render
from unroll import Net
from unroll.core.errors import TemplateError
from unroll.frontend.render_limits import CHARS_ENV
from unroll.frontend.template import builtin_template_dir, load_template
from unroll.frontend.tree import Tree
from unroll.frontend.tree_unroller import expand_tree, tree_inputs, tree_widths
from unroll.frontend.unroller import expand

CHILD_SUM = "child_sum_tree_lstm"
TREES = [Tree.from_heads([2, 0, 2, 3]), Tree.from_heads([0])]

NET_WITH_A_TREE = """{% set interface = {"kind": "net", "defaults": {"widths": [], "hidden": 3}} %}
layer { name: "input" type: "Input" top: "x"
        input_param { shape { dim: {{ batch }} dim: 2 } } }
{{ tree("child_sum_tree_lstm", "x", "h", widths, direction="up", hidden=hidden) }}
"""


def _counting_parses(monkeypatch) -> list:
    parses = []
    parse = unroll.frontend.render.parse_text
    monkeypatch.setattr(unroll.frontend.render, "parse_text",
                        lambda text, *a: parses.append(text) or parse(text, *a))
    return parses


def test_a_tree_step_template_expands_through_expand_and_is_cached(monkeypatch):
    widths = tree_widths(TREES, "bidirectional")
    parses = _counting_parses(monkeypatch)
    net = expand(CHILD_SUM, widths=widths, input_dim=2, direction="bidirectional", hidden=3)
    built = len(parses)
    assert built > 0
    again = expand_tree(CHILD_SUM, widths, input_dim=2, direction="bidirectional", hidden=3)
    assert again == net and len(parses) == built


def test_a_net_template_places_a_tree_layer_where_it_calls_tree(tmp_path):
    path = tmp_path / "with_tree.prototxt.j2"
    path.write_text(NET_WITH_A_TREE)
    widths = tree_widths(TREES, "up")
    rows = sum(widths)
    placed = Net(expand(str(path), steps=1, batch=rows, widths=list(widths)), dtype="float64",
                 seed=1)
    alone = Net(expand_tree(CHILD_SUM, widths, input_dim=2, hidden=3), dtype="float64", seed=1)
    x = np.random.default_rng(0).normal(size=(rows, 2))
    inputs = tree_inputs(TREES, load_template(CHILD_SUM), widths, "up")
    np.testing.assert_array_equal(placed.forward(x=x, **inputs)["h"],
                                  alone.forward(x=x, **inputs)["h"])


def test_a_tree_expansion_is_checked_by_building_its_net(tmp_path):
    source = (builtin_template_dir() / f"{CHILD_SUM}.prototxt.j2").read_text()
    wrong = tmp_path / "wrong.prototxt.j2"
    # the node's gates come out one hidden short: the net cannot build
    wrong.write_text(source.replace("num_output: {{ 3 * hidden }}",
                                    "num_output: {{ 3 * hidden - 1 }}", 1))
    with pytest.raises(TemplateError, match=r"wrong\.prototxt\.j2: the net unrolled to 1 step"
                                            r"\(s\) does not build"):
        expand(str(wrong), widths=(2, 1), input_dim=2, hidden=3)


def test_a_tree_expansion_renders_under_the_one_render_budget(monkeypatch):
    monkeypatch.setenv(CHARS_ENV, "20000")
    expand(CHILD_SUM, widths=(1,), input_dim=2, hidden=3)
    with pytest.raises(TemplateError, match=r"passed the limit of 20000 characters"):
        expand(CHILD_SUM, widths=(1,) * 30, input_dim=2, hidden=3)


@pytest.mark.parametrize("call, message", [
    (lambda: expand("lstm", input_dim=2, hidden=3),
     r"^lstm\.prototxt\.j2: expanding a step template needs steps=$"),
    (lambda: expand(CHILD_SUM, steps=3, widths=(1,), input_dim=2, hidden=3),
     r"^child_sum_tree_lstm\.prototxt\.j2: a tree_step template runs over level widths "
     r"\(widths=\.\.\.\), not steps; found steps=3$"),
    (lambda: expand(CHILD_SUM, input_dim=2, hidden=3),
     r"^child_sum_tree_lstm\.prototxt\.j2: expanding a tree_step template needs widths=$"),
])
def test_what_an_expansion_lacks_is_one_line(call, message):
    with pytest.raises(TemplateError, match=message):
        call()


def test_the_caller_gives_the_chunk_a_sequence_macro_runs_over():
    def projections(**chunk):
        net = expand("lstm", steps=40, batch=2, input_dim=3, hidden=2, **chunk)
        return sorted(lp.name for lp in net.layer if lp.name.startswith("x_proj_seq"))

    assert projections(chunk=None) == ["x_proj_seq"]
    assert projections(chunk=16) == ["x_proj_seq_c0", "x_proj_seq_c1", "x_proj_seq_c2"]
    assert len(projections()) == 2  # the engine's weight-gradient chunk, 32 steps
    with pytest.raises(TemplateError, match=r"^lstm\.prototxt\.j2: chunk must be an integer "
                                            r">= 1 \(steps\) or None, found 0$"):
        expand("lstm", steps=4, input_dim=3, hidden=2, chunk=0)
