"""unroll.train.bptt_windows: a stream cut into N rows of T-step windows (docs/design.md,
3. Unrolling), each row carrying on from the window before."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.train.bptt_windows import bptt_windows


@given(st.lists(st.integers(0, 50), min_size=2, max_size=80), st.integers(1, 7),
       st.integers(1, 9))
def test_the_rows_read_in_order_are_the_stream_and_each_target_is_the_next_symbol(
        stream, rows, steps):
    cut = bptt_windows(stream, rows, steps)
    assert all(x.shape == y.shape and x.shape[1] == rows for x, y in cut)
    assert {len(x) for x, _ in cut[:-1]} <= {steps} and 1 <= len(cut[-1][0]) <= steps
    # a row read window after window is one contiguous stretch of the stream
    x = np.concatenate([x for x, _ in cut]).T.ravel()
    y = np.concatenate([y for _, y in cut]).T.ravel()
    valid = y != -1
    assert x[valid].tolist() == stream[:-1] and y[valid].tolist() == stream[1:]
    assert valid[:len(stream) - 1].all() and not valid[len(stream) - 1:].any()


def test_padding_takes_the_ignore_label_given():
    (x, y), = bptt_windows([4, 5, 6], rows=2, steps=5, ignore=9)
    assert x.T.tolist() == [[4], [5]] and y.T.tolist() == [[5], [6]]
    (x, y), = bptt_windows([4, 5, 6], rows=3, steps=5, ignore=9)
    assert x.T.tolist() == [[4], [5], [6]] and y.T.tolist() == [[5], [6], [9]]


@pytest.mark.parametrize(("stream", "rows", "steps", "found"), [
    ([1], 1, 1, "a stream of 1 symbols"), ([1, 2], 0, 1, "found 0 and 1"),
    ([1, 2], 1, 0, "found 1 and 0")])
def test_a_stream_too_short_or_a_size_below_one_is_refused(stream, rows, steps, found):
    with pytest.raises(ValueError, match=found):
        bptt_windows(stream, rows, steps)
