"""BatchMatMul: attention's scores (memory x query) and contexts (weights x memory)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.engine.backend import to_numpy
from unroll.testing import run_layer as run

SIDES = st.integers(1, 3)


@given(S=SIDES, N=SIDES, H=SIDES, data=st.data())
def test_scores_and_contexts_gradients(S, N, H, data):
    memory = data.draw(testing.arrays((S, N, H)))
    testing.check_layer_gradient('type: "BatchMatMul"', [memory, data.draw(testing.arrays((N, H)))])
    testing.check_layer_gradient('type: "BatchMatMul"', [data.draw(testing.arrays((S, N))), memory])


def test_scores_then_softmax_then_context_is_dot_attention(xp):
    rng = np.random.default_rng(0)
    memory, query = rng.normal(size=(5, 2, 3)), rng.normal(size=(2, 3))
    _, _, (scores,) = run('type: "BatchMatMul"', [memory, query], xp)
    want = np.einsum("snh,nh->sn", memory, query)
    np.testing.assert_allclose(to_numpy(scores.data), want)
    weights = np.exp(want) / np.exp(want).sum(0)
    _, _, (context,) = run('type: "BatchMatMul"', [weights, memory], xp)
    np.testing.assert_allclose(to_numpy(context.data), (weights[:, :, None] * memory).sum(0))


@pytest.mark.parametrize("shapes", [((3, 2, 4), (2, 5)), ((3, 2), (3, 4, 2)), ((3, 2), (2, 3)),
                                    ((3, 2, 4), (3, 2, 4))])
def test_bottoms_that_are_neither_form_are_refused_naming_both(shapes):
    with pytest.raises(NetError, match=r"layer 'a' \(BatchMatMul\): bottoms 'bottom0' .* and "
                                       r"'bottom1' .* are neither a memory \(S, N, H\)"):
        run('name: "a" type: "BatchMatMul"', [np.ones(s) for s in shapes])
