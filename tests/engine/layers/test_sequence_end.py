import numpy as np
import pytest

from unroll import NetError, testing
from unroll.engine.backend import to_numpy

STATES = [np.random.default_rng(k).uniform(-1, 1, (1, 3, 2)) for k in range(3)]
# run steps 1, 2 of three columns: lengths 3, 1 and 2 when the sequence leads the run
LEADING = [np.array([[1.0, 0.0, 1.0]]), np.array([[1.0, 0.0, 0.0]])]


def test_leading_picks_each_columns_last_step_and_routes_its_gradient(xp):
    layer, _, (top,) = testing.run_layer('type: "LeadingSequenceEnd"', STATES + LEADING, xp)
    want = np.concatenate([STATES[2][:, :1], STATES[0][:, 1:2], STATES[1][:, 2:]], axis=1)
    np.testing.assert_array_equal(to_numpy(top.data), want)
    testing.check_layer_gradient('type: "LeadingSequenceEnd"', STATES + LEADING, check=[0, 1, 2],
                                 xp=xp)


def test_trailing_takes_the_last_step_after_checking_the_padding(xp):
    trailing = [np.array([[1.0, 0.0, 0.0]]), np.array([[1.0, 0.0, 1.0]])]  # 0 ... 0 1 ... 1
    _, _, (top,) = testing.run_layer('type: "TrailingSequenceEnd"', STATES[2:] + trailing, xp)
    np.testing.assert_array_equal(to_numpy(top.data), STATES[2])
    testing.check_layer_gradient('type: "TrailingSequenceEnd"', STATES[2:] + trailing, check=[0],
                                 xp=xp)
    with pytest.raises(NetError, match=r"column 2 does not hold one sequence.*\[0 1\]"):
        testing.run_layer('type: "LeadingSequenceEnd"', STATES + trailing, xp)
    with pytest.raises(NetError, match=r"column 2 does not hold one sequence.*\[1 0\]"):
        testing.run_layer('type: "TrailingSequenceEnd"', STATES[2:] + LEADING, xp)


def test_malformed_bottoms_name_the_layer():
    with pytest.raises(NetError, match="an odd number of bottoms"):
        testing.run_layer('name: "e" type: "LeadingSequenceEnd"', STATES[:2] + LEADING)
    with pytest.raises(NetError, match=r"layer 'e' \(LeadingSequenceEnd\): cont .* must be"):
        testing.run_layer('name: "e" type: "LeadingSequenceEnd"', STATES[:2] + [np.ones((1, 2))])
    with pytest.raises(NetError, match="cont must be 0 or 1, found"):
        testing.run_layer('name: "e" type: "TrailingSequenceEnd"', STATES[:1] + [LEADING[0] / 2])
