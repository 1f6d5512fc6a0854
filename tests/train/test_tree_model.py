"""TreeModel's run-time randomness: each key's net draws from (seed, key) alone."""

import numpy as np

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
