import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.train.bucketing import (
    BucketSampler,
    choose_boundaries,
    choose_row_lengths,
    cont_from_lengths,
    cont_from_packed_lengths,
    time_major,
    time_major_packed,
    unpack_time_major,
)

lengths_st = st.lists(st.integers(1, 60), min_size=1, max_size=250)
boundaries_st = st.none() | st.lists(st.integers(1, 70), min_size=1, max_size=8, unique=True).map(
    sorted
)


@st.composite
def samplers(draw, drop_last=None):
    """(sampler, its arguments) over random lengths, boundaries and settings."""
    by_tokens = draw(st.booleans())
    kwargs = dict(
        lengths=draw(lengths_st),
        batch_size=draw(st.integers(1, 200) if by_tokens else st.integers(1, 40)),
        boundaries=draw(boundaries_st),
        seed=draw(st.integers(0, 2**32)),
        by_tokens=by_tokens,
        shuffle=draw(st.booleans()),
        drop_last=draw(st.booleans()) if drop_last is None else drop_last,
    )
    return BucketSampler(**kwargs), kwargs


def bucket_ids(sampler):
    """Bucket of every sequence, straight from the definition (first boundary >= length)."""
    return np.array([np.searchsorted(sampler.boundaries, L, side="left") for L in sampler.lengths])


@given(samplers(drop_last=False))
def test_every_sequence_exactly_once(case):
    sampler, kwargs = case
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(kwargs["lengths"])))
    assert len(batches) == len(sampler)
    assert all(len(b) >= 1 and all(isinstance(i, int) for i in b) for b in batches)


@given(samplers(drop_last=True))
def test_drop_last_drops_only_each_buckets_incomplete_batch(case):
    sampler, _ = case
    batches = list(sampler)
    seen = [i for b in batches for i in b]
    assert len(seen) == len(set(seen)) and len(batches) == len(sampler)
    ids = bucket_ids(sampler)
    for bucket in np.unique(ids):
        members = np.flatnonzero(ids == bucket)
        in_batches = [b for b in batches if ids[b[0]] == bucket]
        size = len(in_batches[0]) if in_batches else None
        assert all(len(b) == size for b in in_batches)  # only full batches are kept
        dropped = len(members) - sum(len(b) for b in in_batches)
        cap = sampler.batch_size
        if sampler.by_tokens:
            cap = max(1, sampler.batch_size // int(sampler.lengths[members].max()))
        assert 0 <= dropped < cap


@given(samplers())
def test_each_batch_comes_from_one_bucket(case):
    sampler, _ = case
    ids = bucket_ids(sampler)
    bounds = (0, *sampler.boundaries)
    for batch in sampler:
        lengths = sampler.lengths[batch]
        bucket = ids[batch[0]]
        assert (ids[batch] == bucket).all()
        padded = sampler.bucket_length(batch)
        # padded to the bucket's boundary capped at its longest member
        assert padded == sampler.lengths[ids == bucket].max()
        assert (lengths <= padded).all() and (lengths > bounds[bucket]).all()
        if bucket < len(sampler.boundaries):
            assert padded <= sampler.boundaries[bucket]


@given(samplers())
def test_same_seed_same_order_per_epoch(case):
    sampler, kwargs = case
    twin = BucketSampler(**kwargs)
    first, second = list(sampler), list(sampler)
    assert sampler.epoch == 2
    assert first == twin.epoch_batches(0) and second == twin.epoch_batches(1)
    sampler.set_epoch(1)
    assert list(sampler) == second and sampler.epoch == 2
    twin.set_epoch(0)
    assert list(twin) == first


def test_epochs_and_seeds_differ_on_large_input():
    lengths = [1 + (7 * i) % 50 for i in range(600)]
    a = BucketSampler(lengths, batch_size=8, seed=3)
    e0, e1 = list(a), list(a)
    assert e0 != e1
    assert sorted(map(sorted, e0)) != sorted(map(sorted, e1))  # batch contents change too
    assert BucketSampler(lengths, batch_size=8, seed=4).epoch_batches(0) != e0


def test_no_shuffle_is_bucket_order_then_input_order():
    s = BucketSampler([4, 1, 3, 2, 9], batch_size=2, boundaries=[2, 4], shuffle=False)
    assert list(s) == [[1, 3], [0, 2], [4]] == list(s)
    assert s.bucket_lengths == (2, 4, 9) and s.num_buckets == 3


@given(samplers(drop_last=False).filter(lambda c: c[1]["by_tokens"]))
def test_by_tokens_respects_the_budget(case):
    """A batch's padded tokens stay within batch_size, except a single sequence that is
    alone longer than the budget (it still gets a batch of its own)."""
    sampler, _ = case
    full = {}
    for batch in sampler:
        padded = sampler.bucket_length(batch)
        assert padded * len(batch) <= sampler.batch_size or (
            len(batch) == 1 and padded > sampler.batch_size
        )
        # as many as fit: at most one batch per bucket is smaller than the capacity
        cap = max(1, sampler.batch_size // padded)
        assert len(batch) <= cap
        full.setdefault(padded, []).append(len(batch) == cap)
    assert all(flags.count(False) <= 1 for flags in full.values())


def test_by_tokens_oversized_sequence_gets_its_own_batch():
    s = BucketSampler([30, 2, 2, 2], batch_size=10, boundaries=[5], by_tokens=True)
    assert sorted(map(sorted, s)) == [[0], [1, 2, 3]]


@given(samplers())
def test_padding_fraction_matches_direct_computation(case):
    sampler, _ = case
    ids = bucket_ids(sampler)
    epoch = sampler.epoch
    padded = real = 0
    for batch in sampler.epoch_batches(epoch):
        L = sampler.lengths[ids == ids[batch[0]]].max()
        padded += L * len(batch)
        real += sampler.lengths[batch].sum()
    expected = (padded - real) / padded if padded else 0.0
    assert sampler.padding_fraction() == pytest.approx(expected)
    assert 0.0 <= sampler.padding_fraction() < 1.0


def test_one_bucket_pads_to_the_longest_and_default_buckets_pad_less():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 80, size=2000)
    one = BucketSampler(lengths, batch_size=32, boundaries=[int(lengths.max())])
    default = BucketSampler(lengths, batch_size=32)
    direct = 1 - lengths.sum() / (lengths.max() * len(lengths))
    assert one.padding_fraction() == pytest.approx(direct)
    assert default.padding_fraction() < 0.06 < one.padding_fraction()


@given(lengths_st, st.integers(1, 40), st.floats(0.0, 0.5), st.booleans())
def test_choose_boundaries_bounds_each_buckets_padding(lengths, min_size, max_padding, by_tokens):
    bounds = choose_boundaries(lengths, min_size, max_padding, by_tokens)
    assert bounds == sorted(set(bounds)) and bounds[-1] == max(lengths)
    arr = np.array(lengths)
    ids = np.searchsorted(bounds, arr, side="left")
    for b, upper in enumerate(bounds):
        members = np.sort(arr[ids == b])
        assert members.size and members[-1] == upper  # every bucket is used, up to its boundary
        padding = 1 - members.sum() / (members.size * upper)
        rest = members[members < upper]  # the bucket before its last length was added
        rest_full = rest.size and (
            rest.size * rest[-1] >= min_size if by_tokens else rest.size >= min_size
        )
        assert padding <= max_padding + 1e-12 or not rest_full
        if b < len(bounds) - 1:  # closed buckets hold at least one batch
            full = members.size * upper >= min_size if by_tokens else members.size >= min_size
            assert full


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lengths=[3, 0, 2]), r"lengths\[1\] = 0"),
        (dict(lengths=[3, -4]), r"lengths\[1\] = -4"),
        (dict(lengths=[]), "empty"),
        (dict(lengths=[1.5, 2.0]), "float64"),
        (dict(lengths=[[1, 2]]), "1-D"),
        (dict(lengths=[1, 2], batch_size=0), "batch_size must be >= 1, got 0"),
        (dict(lengths=[1, 2], batch_size=2.5), "batch_size must be an integer, got 2.5"),
        (dict(lengths=[1, 2], boundaries=[5, 3]), r"boundaries\[1\] = 3"),
        (dict(lengths=[1, 2], boundaries=[3, 3]), r"boundaries\[1\] = 3"),
        (dict(lengths=[1, 2], boundaries=[0, 3]), r"boundaries\[0\] must be >= 1, got 0"),
        (dict(lengths=[1, 2], boundaries=[]), "boundaries is empty"),
        (dict(lengths=[1, 2], seed=-1), "seed must be >= 0, got -1"),
    ],
)
def test_bad_arguments_name_the_offending_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BucketSampler(**kwargs)


def test_bucket_length_rejects_mixed_or_bad_batches():
    s = BucketSampler([1, 2, 10], batch_size=2, boundaries=[2])
    assert s.bucket_length([0, 1]) == 2 and s.bucket_length([2]) == 10
    with pytest.raises(ValueError, match=r"mixes buckets of lengths \[2, 10\]"):
        s.bucket_length([0, 2])
    with pytest.raises(ValueError, match="outside"):
        s.bucket_length([3])
    with pytest.raises(ValueError, match="non-empty"):
        s.bucket_length([])


def test_lengths_above_last_boundary_form_a_final_bucket():
    s = BucketSampler([1, 5, 7, 6], batch_size=4, boundaries=[2], shuffle=False)
    assert list(s) == [[0], [1, 2, 3]] and s.bucket_lengths == (1, 7)  # capped at longest


@given(
    st.lists(st.lists(st.integers(-5, 5), max_size=8), min_size=1, max_size=6),
    st.integers(0, 4),
    st.integers(-9, 9),
)
def test_time_major_values_and_cont(seqs, extra, pad):
    T = max(len(s) for s in seqs) + extra
    values, cont = time_major(seqs, T, pad_value=pad)
    assert values.shape == cont.shape == (T, len(seqs)) and cont.dtype == np.float32
    for n, s in enumerate(seqs):
        for t in range(T):
            assert values[t, n] == (s[t] if t < len(s) else pad)
            assert cont[t, n] == (1.0 if 0 < t < len(s) else 0.0)


def test_time_major_items_with_trailing_shape_and_errors():
    a, b = np.arange(6.0).reshape(3, 2), np.ones((1, 2))
    values, cont = time_major([a, b], 4, pad_value=-1)
    assert values.shape == (4, 2, 2) and values.dtype == np.float64
    np.testing.assert_array_equal(values[:3, 0], a)
    np.testing.assert_array_equal(values[1:, 1], -1)
    assert cont[:, 0].tolist() == [0, 1, 1, 0] and cont[:, 1].tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="sequence 1 has length 3 > padded length 2"):
        time_major([[1], [1, 2, 3]], 2)
    with pytest.raises(ValueError, match="shape"):
        time_major([np.ones((2, 2)), np.ones((2, 3))], 2)


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=6),
    st.integers(0, 3),
    st.sampled_from(["left", "right"]),
)
def test_alignment_puts_padding_on_its_side(lengths, extra, align):
    T = max(lengths) + extra
    seqs = [list(range(1, n + 1)) for n in lengths]
    values, cont = time_major(seqs, T, pad_value=-1, align=align)
    np.testing.assert_array_equal(cont, cont_from_lengths(lengths, T, align=align))
    for n, s in enumerate(seqs):
        start = 0 if align == "left" else T - len(s)
        assert values[:, n].tolist() == [-1] * start + s + [-1] * (T - start - len(s))
        # cont is 1 exactly inside the sequence after its first step
        assert cont[:, n].tolist() == [float(start < t < start + len(s)) for t in range(T)]
    if align == "right":  # step T-1 holds every non-empty sequence's last item
        assert all(values[-1, n] == s[-1] for n, s in enumerate(seqs) if s)


def test_continuing_streams_start_with_cont_one():
    cont = cont_from_lengths([4, 2, 0], 4, continues=True)
    assert cont[:, 0].tolist() == [1, 1, 1, 1]
    assert cont[:, 1].tolist() == [1, 1, 0, 0]  # continues, then padding
    assert cont[:, 2].tolist() == [0, 0, 0, 0]  # nothing to continue
    per_stream = cont_from_lengths([3, 3], 3, continues=[False, True])
    assert per_stream[0].tolist() == [0, 1]
    _, via_time_major = time_major([[1, 2], [3]], 2, continues=True)
    assert via_time_major[0].tolist() == [1, 1]
    with pytest.raises(ValueError, match="continues from the previous chunk.*align='left'"):
        cont_from_lengths([2, 3], 3, align="right", continues=True)
    with pytest.raises(ValueError, match="one bool per sequence"):
        cont_from_lengths([2, 3], 3, continues=[True])
    with pytest.raises(ValueError, match="align must be"):
        time_major([[1]], 2, align="center")
    with pytest.raises(ValueError, match=r"lengths\[1\] = 4 is not in 0..3"):
        cont_from_lengths([2, 4], 3)


# -- packing: rows of whole sequences back to back ----------------------------------------


@st.composite
def packed_samplers(draw, drop_last=None, size=1):
    """(sampler with pack=True, its arguments) over random lengths, row lengths and settings."""
    sampler, kwargs = draw(samplers(drop_last))
    kwargs.update(pack=True, size=size)
    return BucketSampler(**kwargs), kwargs


def row_lengths_of(sampler):
    """Row length of every sequence's bucket, from the definition (the longest beyond them)."""
    ids = bucket_ids(sampler)
    return np.append(sampler.boundaries, sampler.lengths.max())[ids]


def first_fit_decreasing(lengths, row_length):
    """Rows of indices by the textbook rule: longest first (ties in input order), each into
    the first row opened with room for it, else into a new row of its bucket's length."""
    rows, room = [], []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fit = next((r for r in range(len(rows)) if room[r] >= lengths[i]), None)
        if fit is None:
            rows.append([])
            room.append(row_length[i])
            fit = len(rows) - 1
        rows[fit].append(i)
        room[fit] -= lengths[i]
    return rows


@given(packed_samplers(drop_last=False), st.integers(0, 3))
def test_packed_every_sequence_exactly_once_per_epoch(case, epoch):
    sampler, kwargs = case
    batches = sampler.epoch_batches(epoch)
    assert len(batches) == len(sampler)
    seen = [i for batch in batches for row in batch for i in row]
    assert sorted(seen) == list(range(len(kwargs["lengths"])))
    assert all(isinstance(i, int) for i in seen)


@given(packed_samplers(), st.integers(0, 3))
def test_packed_rows_fit_their_length_and_batches_hold_one_row_length(case, epoch):
    sampler, _ = case
    row_length = row_lengths_of(sampler)
    full = {}
    for batch in sampler.epoch_batches(epoch):
        L = sampler.bucket_length(batch)
        assert L in sampler.bucket_lengths
        for row in batch:
            assert sampler.lengths[row].sum() <= L
            assert row_length[row].max() == L  # opened by a sequence of its bucket
        cap = max(1, sampler.batch_size // L) if sampler.by_tokens else sampler.batch_size
        assert len(batch) <= cap
        full.setdefault(L, []).append(len(batch) == cap)
    # every row length has full batches but at most one, which drop_last leaves out
    assert all(flags.count(False) <= (0 if sampler.drop_last else 1) for flags in full.values())


@given(packed_samplers(drop_last=False).filter(lambda c: not c[1]["shuffle"]))
def test_packed_rows_are_first_fit_decreasing(case):
    sampler, kwargs = case
    expected = first_fit_decreasing(kwargs["lengths"], row_lengths_of(sampler))
    by_length = [[row for row in expected if sampler.bucket_length([row]) == L]
                 for L in sampler.bucket_lengths]
    assert [row for batch in sampler for row in batch] == [row for g in by_length for row in g]


@given(packed_samplers(drop_last=False).filter(lambda c: c[1]["shuffle"]), st.integers(0, 3))
def test_packed_shuffle_keeps_the_first_fit_row_shapes(case, epoch):
    """Each epoch packs the shuffled sequences afresh: the rows' length patterns are those of
    first-fit decreasing, whatever sequences of those lengths fill them."""
    sampler, kwargs = case
    lengths = kwargs["lengths"]
    expected = first_fit_decreasing(lengths, row_lengths_of(sampler))
    patterns = sorted(tuple(lengths[i] for i in row) for row in expected)
    rows = [row for batch in sampler.epoch_batches(epoch) for row in batch]
    assert sorted(tuple(lengths[i] for i in row) for row in rows) == patterns


def test_packed_epochs_change_which_sequences_share_a_row():
    lengths = [1 + (7 * i) % 50 for i in range(600)]
    s = BucketSampler(lengths, batch_size=8, pack=True, seed=3)
    rows = [{frozenset(r) for b in s.epoch_batches(e) for r in b} for e in range(2)]
    assert rows[0] != rows[1]


@given(packed_samplers(), st.integers(0, 3))
def test_packed_same_seed_same_batches_per_epoch(case, epoch):
    sampler, kwargs = case
    assert BucketSampler(**kwargs).epoch_batches(epoch) == sampler.epoch_batches(epoch)
    sampler.set_epoch(epoch)
    assert list(sampler) == sampler.epoch_batches(epoch) and sampler.epoch == epoch + 1


@given(packed_samplers(), st.integers(1, 5), st.integers(0, 3))
def test_packed_ranks_share_every_batch_once(case, size, epoch):
    sampler, kwargs = case
    alone = sampler.epoch_batches(epoch)
    shards = [BucketSampler(**{**kwargs, "size": size, "rank": r}).epoch_batches(epoch)
              for r in range(size)]
    steps = len(alone) // size
    assert [len(s) for s in shards] == [steps] * size
    assert [shards[r][i] for i in range(steps) for r in range(size)] == alone[: steps * size]


@given(packed_samplers())
def test_packed_padding_fraction_matches_direct_computation(case):
    sampler, _ = case
    padded = real = 0
    for batch in sampler.epoch_batches(sampler.epoch):
        padded += sampler.bucket_length(batch) * len(batch)
        real += sum(int(sampler.lengths[row].sum()) for row in batch)
    expected = (padded - real) / padded if padded else 0.0  # drop_last may leave no batch
    assert sampler.padding_fraction() == pytest.approx(expected)


def test_packing_pads_less_with_fewer_lengths_than_buckets():
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.geometric(1 / 16, size=4000), 150)  # many short, a few long
    packed = BucketSampler(lengths, batch_size=32, pack=True)
    bucketed = BucketSampler(lengths, batch_size=32)
    assert packed.padding_fraction() < 0.01 < bucketed.padding_fraction()
    assert packed.num_buckets < bucketed.num_buckets
    assert list(packed.bucket_lengths) == choose_row_lengths(lengths)


def test_packed_without_shuffle_fills_rows_in_order():
    s = BucketSampler([3, 5, 2, 9, 1, 4], batch_size=2, boundaries=[6], pack=True, shuffle=False)
    assert s.bucket_lengths == (6, 9)
    # 9 fills a row of 9; 5, 4 and 3 each open a row of 6; the 2 fits first beside the 4,
    # the 1 beside the 5
    assert list(s) == [[[1, 4], [5, 2]], [[0]], [[3]]] == list(s)
    assert s.padding_fraction() == pytest.approx(3 / 27)


@given(lengths_st, st.integers(1, 70))
def test_choose_row_lengths_doubles_up_to_the_longest(lengths, shortest):
    rows = choose_row_lengths(lengths, shortest)
    assert rows[-1] == max(lengths) and rows == sorted(set(rows))
    assert all(b == 2 * a for a, b in zip(rows, rows[1:-1]))
    assert rows[0] == shortest or rows == [max(lengths)]
    assert len(rows) == 1 or 2 * rows[-2] < max(lengths)


def test_packed_bucket_length_rejects_bad_batches():
    s = BucketSampler([2, 3, 4, 7, 10], batch_size=2, boundaries=[5], pack=True)
    assert s.bucket_length([[0, 1], [2]]) == 5 and s.bucket_length([[4]]) == 10
    assert s.bucket_length([[3, 1]]) == 10  # a short one filling a long row
    for batch, match in [
        ([[0, 1], [4]], r"mixes rows of lengths \[5, 10\]"),
        ([[1, 2]], "row 0 holds 7 tokens, more than its row length 5"),
        ([[0], []], "row 1 .* non-empty"),
        ([], "non-empty list of rows"),
        ([[7]], "outside"),
        ([0, 1], "row 0 .* non-empty list"),
    ]:
        with pytest.raises(ValueError, match=match):
            s.bucket_length(batch)


@given(st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=5), min_size=1, max_size=6),
       st.data())
def test_time_major_packed_places_each_sequence_at_its_span(seqs, data):
    rows = data.draw(st.permutations(range(len(seqs))).flatmap(
        lambda order: st.integers(1, len(order)).map(
            lambda k: [list(order[i::k]) for i in range(k)])))
    T = max(sum(len(seqs[i]) for i in row) for row in rows) + data.draw(st.integers(0, 3))
    values, cont, spans = time_major_packed(rows, seqs, T, pad_value=-9)
    assert values.shape == cont.shape == (T, len(rows))
    flat = [i for row in rows for i in row]
    for i, got in zip(flat, unpack_time_major(values, spans)):
        assert got.tolist() == seqs[i]
    used = np.zeros((T, len(rows)), bool)
    for i, (row, offset, n) in zip(flat, spans):
        assert n == len(seqs[i]) and cont[offset, row] == 0
        assert (cont[offset + 1 : offset + n, row] == 1).all()
        assert not used[offset : offset + n, row].any()
        used[offset : offset + n, row] = True
    assert (values[~used] == -9).all() and (cont[~used] == 0).all()
    np.testing.assert_array_equal(
        cont, cont_from_packed_lengths([[len(seqs[i]) for i in row] for row in rows], T))


def test_time_major_packed_errors_name_the_row():
    with pytest.raises(ValueError, match="row 0 holds 5 steps, more than its length 4"):
        time_major_packed([[0, 1]], [[1, 2], [3, 4, 5]], 4)
    with pytest.raises(ValueError, match="row 1 must be a non-empty list"):
        time_major_packed([[0], []], [[1]], 2)
    with pytest.raises(ValueError, match="row 0: its sequences have items of different shapes"):
        time_major_packed([[0, 1]], [np.ones((1, 2)), np.ones((1, 3))], 2)
    with pytest.raises(ValueError, match="sequence 1 .*row 0.* non-empty sequence"):
        time_major_packed([[0, 1]], [[1], []], 2)
    with pytest.raises(ValueError, match=r"span 0 .* outside"):
        unpack_time_major(np.zeros((2, 1)), [(0, 1, 2)])


def test_the_sampler_imports_without_protobuf_or_the_layers():
    import subprocess
    import sys

    code = ("import sys, unroll.train.bucketing; "
            "print(sorted(m for m in ('google.protobuf', 'unroll.engine.layer', "
            "'unroll.engine.net') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
