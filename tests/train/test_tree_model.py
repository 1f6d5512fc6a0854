"""TreeModel's run-time randomness: each key's net draws from (seed, key) alone."""

import numpy as np
import pytest

from unroll.core.proto import NetParameter, parse_text
from unroll.train.tree_model import TreeModel


def dropout_net(width: int) -> NetParameter:
    return parse_text(f"""
        layer {{ name: "input" type: "Input" top: "x"
                input_param {{ shape {{ dim: {width} dim: 16 }} }} }}
        layer {{ name: "drop" type: "Dropout" bottom: "x" top: "y"
                dropout_param {{ dropout_ratio: 0.5 }} }}
    """, NetParameter())


def masks(model: TreeModel, keys) -> dict:
    return {k: model.forward(widths=k, x=np.ones((k, 16)))["y"].copy() for k in keys}


def test_a_reseeded_model_draws_the_same_masks_whatever_order_its_nets_were_built_in():
    ahead, behind = TreeModel(dropout_net, 1), TreeModel(dropout_net, 1)
    masks(ahead, [2, 3, 4])  # built, and drawn from, before the reseed
    ahead.seed(7)
    behind.seed(7)
    first = masks(ahead, [3, 2, 4])
    second = masks(behind, [4, 3, 2])
    assert all(np.array_equal(first[k], second[k]) for k in first)
    assert not np.array_equal(first[2][:1], masks(behind, [2])[2][:1])  # the stream goes on


# -- inputs must have the rows the tree's structure fixes ------------------------------------
def nary_model() -> TreeModel:
    from unroll.frontend.tree_unroller import expand_tree

    return TreeModel(lambda w: expand_tree("nary_tree_lstm", w, input_dim=2, hidden=3), (1,))


@pytest.mark.parametrize("rows", [0, 4, 6, 9])
def test_an_x_whose_rows_are_not_the_node_count_is_refused_in_one_line(rows):
    model = nary_model()
    with pytest.raises(ValueError) as e:
        model.forward(widths=(3, 2), x=np.ones((rows, 2)))
    assert str(e.value) == (f"the tree net of widths (3, 2): input 'x' must have 5 rows "
                            f"(one per node), found {rows}")
    assert model.forward(widths=(3, 2), x=np.ones((5, 2)))["h"].shape == (5, 3)


def test_a_structure_input_of_other_rows_is_refused_naming_it():
    model = nary_model()
    with pytest.raises(ValueError, match=r"^the tree net of widths \(3, 2\): input 'src_0' "
                                         r"must have 6 rows, found 2$"):
        model.forward(widths=(3, 2), x=np.ones((5, 2)), src_0=np.zeros(2))
    with pytest.raises(ValueError, match="input 'x' must have 5 rows .*, found a scalar$"):
        model.forward(widths=(3, 2), x=np.float64(1))


# -- a tree net is built once: expand's check builds the model's own ---------------------
def test_a_new_tree_net_is_built_once_the_check_building_the_models_net(monkeypatch):
    from unroll.engine.net import Net

    built = []
    build = Net._build
    monkeypatch.setattr(Net, "_build", lambda net, layers: built.append(net) or build(net, layers))
    model = nary_model()
    widths = (4, 3, 2)  # a key no other test expands, so expand checks (and builds) it
    model.forward(widths=widths, x=np.ones((9, 2)))
    mine = [net for net in built if net is model.nets[widths]]
    assert len(built) == 2 and len(mine) == 1  # the canonical key's net, and this one
    assert model.nets[widths].phase == "train" and model.nets[widths].store is model.store
    test = TreeModel(model.make_net_param, (1,), phase="test", store=model.store)
    built.clear()
    test.net(widths)  # from expand's cache: no check, the model builds it
    assert built == [test.nets[widths]] and test.nets[widths].phase == "test"
