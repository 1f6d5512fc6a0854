"""Deep trees cost what their nodes do, and every size a tree takes is bounded
(docs/design.md, "Unrolling over trees"): a chain (each word the head of the next) has
as many levels as words, each level as many layers, bottoms and index rows as any other,
so a chain's net grows linearly in its words, as a flat tree's does; tested on structure."""

import pytest

import unroll.frontend.tree as tree_module
from unroll.core.errors import TemplateError, TreeError
from unroll.frontend.template import load_template
from unroll.frontend.tree import MAX_TREE_DEPTH, MAX_TREE_NODES, Tree
from unroll.frontend.tree_unroller import expand_tree, tree_inputs, tree_widths

CHILD_SUM, NARY = "child_sum_tree_lstm", "nary_tree_lstm"


def chain(n: int) -> Tree:
    return Tree.from_heads([0, *range(1, n)])


def flat(n: int) -> Tree:
    return Tree.from_heads([0, *([1] * (n - 1))])


def structure(tree: Tree, template: str, **hyper) -> dict:
    """Levels, layers, bottoms and index-input rows of the bidirectional net of one tree."""
    widths = tree_widths([tree], "bidirectional")
    net = expand_tree(template, widths, input_dim=2, direction="bidirectional", hidden=2,
                      **hyper)
    inputs = tree_inputs([tree], load_template(template), widths, "bidirectional", hyper=hyper)
    return {"levels": max(len(w) for w in widths), "layers": len(net.layer),
            "bottoms": sum(len(lp.bottom) for lp in net.layer),
            "index rows": sum(v.size for v in inputs.values())}


@pytest.mark.parametrize("template, hyper", [(CHILD_SUM, {}), (CHILD_SUM, {"fixed_arity": 2}),
                                             (NARY, {"arity": 2})])
def test_a_chain_grows_linearly_in_its_words(template, hyper):
    sizes = {n: structure(chain(n), template, **hyper) for n in (10, 20, 40)}
    assert [sizes[n]["levels"] for n in sizes] == [10, 20, 40]
    for what in ("layers", "bottoms", "index rows"):
        # each level adds the same: 10 more words add as much as the 10 before them
        step = sizes[20][what] - sizes[10][what]
        assert sizes[40][what] - sizes[20][what] == 2 * step, what


def test_a_flat_tree_keeps_two_levels_and_grows_only_in_its_index_rows():
    small, big = structure(flat(10), CHILD_SUM), structure(flat(400), CHILD_SUM)
    assert small["levels"] == big["levels"] == 2
    assert small["layers"] == big["layers"] and small["bottoms"] == big["bottoms"]


def test_every_child_is_read_from_the_level_next_to_its_parent():
    # a chain with a leaf on its root: bottom-up, the leaf runs right below the root
    tree = Tree.from_heads([0, 1, 2, 3, 1])
    assert tree_module.levels_of(tree, "up").tolist() == [3, 2, 1, 0, 2]
    widths = tree_widths([tree], "up")
    net = expand_tree(CHILD_SUM, widths, input_dim=2, hidden=2)
    tables = [lp for lp in net.layer if lp.type == "Concat" and "_table" in lp.name]
    assert tables and all(len(lp.bottom) == 2 for lp in tables)  # a zero row, one level


@pytest.mark.parametrize("heads, message", [
    ([0, 1.5], r"^tree: word 2's head is 1\.5, not an integer$"),
    (["0", "1"], r"^tree: word 1's head is '0', not an integer$"),
    ([0, True], r"^tree: word 2's head is True, not an integer$"),
])
def test_heads_are_integers(heads, message):
    with pytest.raises(TreeError, match=message):
        Tree.from_heads(heads)


def test_a_tree_has_at_most_max_tree_nodes():
    Tree([-1] + [0] * (MAX_TREE_NODES - 1))
    with pytest.raises(TreeError, match=rf"^tree: {MAX_TREE_NODES + 1} nodes; a tree has at "
                                        rf"most {MAX_TREE_NODES} \(unroll\.frontend\.tree\."
                                        rf"MAX_TREE_NODES\)$"):
        Tree([-1] + [0] * MAX_TREE_NODES)


def test_a_tree_has_at_most_max_tree_depth_levels(monkeypatch):
    monkeypatch.setattr(tree_module, "MAX_TREE_DEPTH", 5)
    chain(5)
    with pytest.raises(TreeError, match=r"^tree: 6 levels \(the longest path from the root\); "
                                        r"a tree has at most 5 \(unroll\.frontend\.tree\."
                                        r"MAX_TREE_DEPTH\)$"):
        chain(6)


def test_a_tree_layer_runs_at_most_max_tree_depth_levels():
    with pytest.raises(TemplateError, match=rf"^up: {MAX_TREE_DEPTH + 1} levels; a tree layer "
                                            rf"runs at most {MAX_TREE_DEPTH} "):
        expand_tree(CHILD_SUM, (1,) * (MAX_TREE_DEPTH + 1), input_dim=2, hidden=2)
