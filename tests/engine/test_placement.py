"""place(): best-fit offsets for buffers with lifetimes (docs/design.md, 6. Memory)."""

import bisect
import heapq
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.engine.memory import place, placement
from unroll.engine.workspace import ALIGN


def reference_place(buffers) -> tuple[list[int], int]:
    """place()'s rule in plain Python over ``(first, last, nbytes)``: by first time (ties
    in order), free what ended before, take the exact size, else the smallest freed block
    at most twice the size (its lowest offset), else new memory at the end."""
    order = sorted(range(len(buffers)), key=lambda i: buffers[i][0])
    ending: list[tuple[int, int]] = []
    free: dict[int, list[int]] = {}
    free_sizes: list[int] = []
    offsets, top = [0] * len(buffers), 0
    sizes = [-(-max(b[2], 1) // ALIGN) * ALIGN for b in buffers]
    for i in order:
        while ending and ending[0][0] < buffers[i][0]:
            j = heapq.heappop(ending)[1]
            if sizes[j] not in free:
                free[sizes[j]] = []
                bisect.insort(free_sizes, sizes[j])
            heapq.heappush(free[sizes[j]], offsets[j])
        k = bisect.bisect_left(free_sizes, sizes[i])
        if k < len(free_sizes) and free_sizes[k] <= 2 * sizes[i]:
            size = free_sizes[k]
            offsets[i] = heapq.heappop(free[size])
            if not free[size]:
                del free[size], free_sizes[k]
            sizes[i] = size
        else:
            offsets[i], top = top, top + sizes[i]
        heapq.heappush(ending, (buffers[i][1], i))
    return offsets, top


def spans(longest):
    return st.tuples(st.integers(0, 60), st.integers(0, longest),
                     st.one_of(st.integers(0, 300), st.sampled_from([64, 128, 4096])))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@given(drawn=st.lists(st.one_of(spans(3), spans(40)), max_size=300))
def test_place_gives_the_references_offsets(compiled, drawn):
    buffers = [(first, first + extra, n) for first, extra, n in drawn]
    first, last, nbytes = (np.array(column, np.int64).reshape(-1) for column in
                           (zip(*buffers) if buffers else ([], [], [])))
    with mock.patch.object(placement, "COMPILED_FROM", 0 if compiled else len(first) + 1), \
            mock.patch.object(placement, "_numba_loaded", lambda: False):
        offsets, total = place(first, last, nbytes)
    want, want_total = reference_place(buffers)
    assert offsets.tolist() == want and total == want_total


def test_place_never_overlaps_live_buffers():
    rng = np.random.default_rng(0)
    first = rng.integers(0, 100, 300)
    last, nbytes = first + rng.integers(0, 20, 300), rng.integers(1, 500, 300)
    offsets, total = place(first, last, nbytes)
    for i in range(300):
        assert offsets[i] + nbytes[i] <= total
        for j in range(i):
            if first[i] <= last[j] and first[j] <= last[i]:
                assert (offsets[i] + nbytes[i] <= offsets[j]
                        or offsets[j] + nbytes[j] <= offsets[i])


def test_place_refuses_a_buffer_that_ends_before_it_starts():
    with pytest.raises(ValueError, match="buffer 1 lives from 4 to 2"):
        place([0, 4], [1, 2], [8, 8])
