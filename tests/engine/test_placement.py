"""place(): best-fit offsets for buffers with lifetimes (docs/design.md, 6. Memory)."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.engine.memory import place, placement
from unroll.engine.workspace import ALIGN


def spans(longest):
    return st.tuples(st.integers(0, 60), st.integers(0, longest),
                     st.one_of(st.integers(0, 300), st.sampled_from([64, 128, 4096])))


def placed(first, last, nbytes, compiled: bool):
    """place() by its compiled pass or by its Python loop."""
    with mock.patch.object(placement, "COMPILED_FROM", 0 if compiled else len(first) + 1), \
            mock.patch.object(placement, "_numba_loaded", lambda: False):
        return place(first, last, nbytes)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_place_takes_the_exact_size_else_the_smallest_at_most_twice_else_new_memory(compiled):
    a = ALIGN
    buffers = [(0, 1, 2 * a), (0, 1, 4 * a), (0, 1, a), (0, 1, a),  # all new
               (2, 3, a), (2, 3, 2 * a),  # exact sizes, the lowest of two first
               (2, 3, 3 * a),  # the 4a block: the smallest at least 3a, within twice
               (2, 3, a), (2, 3, a), (2, 3, 5 * a),  # the last a block, then new memory
               (4, 4, a), (4, 4, 2 * a), (4, 4, a), (4, 4, a),
               (4, 4, a)]  # only 4a and 5a are free: more than twice, so new memory
    offsets, total = placed(*(np.array(c) for c in zip(*buffers)), compiled)
    assert (offsets // a).tolist() == [0, 2, 6, 7, 6, 0, 2, 7, 8, 9, 6, 0, 7, 8, 14]
    assert total == 15 * a


@given(st.lists(st.one_of(spans(3), spans(40)), max_size=300))
def test_the_compiled_pass_gives_the_python_loops_offsets(drawn):
    buffers = [(first, first + extra, n) for first, extra, n in drawn]
    columns = [np.array(column, np.int64).reshape(-1) for column in
               (zip(*buffers) if buffers else ([], [], []))]
    offsets, total = placed(*columns, compiled=True)
    want, want_total = placed(*columns, compiled=False)
    assert offsets.tolist() == want.tolist() and total == want_total


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_place_never_overlaps_live_buffers(compiled):
    rng = np.random.default_rng(0)
    first = rng.integers(0, 100, 300)
    last, nbytes = first + rng.integers(0, 20, 300), rng.integers(1, 500, 300)
    offsets, total = placed(first, last, nbytes, compiled)
    for i in range(300):
        assert offsets[i] + nbytes[i] <= total
        for j in range(i):
            if first[i] <= last[j] and first[j] <= last[i]:
                assert (offsets[i] + nbytes[i] <= offsets[j]
                        or offsets[j] + nbytes[j] <= offsets[i])


def test_place_refuses_a_buffer_that_ends_before_it_starts():
    with pytest.raises(ValueError, match="buffer 1 lives from 4 to 2"):
        place([0, 4], [1, 2], [8, 8])
