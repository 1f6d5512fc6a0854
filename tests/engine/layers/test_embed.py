
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from unroll import Net, NetError, testing
from unroll.engine import trace
from unroll.engine.backend import to_numpy
from unroll.engine.layers import embed
from unroll.testing import run_layer as run


def spec(num_output, input_dim, bias=True, wf='type: "gaussian" std: 1'):
    return (
        f'name: "emb" type: "Embed" embed_param {{ num_output: {num_output} '
        f"input_dim: {input_dim} bias_term: {str(bias).lower()} weight_filler {{ {wf} }} "
        'bias_filler { type: "uniform" min: -1 max: 1 } }'
    )


def indices(shape, input_dim):
    return hnp.arrays(np.float64, shape, elements=st.integers(0, input_dim - 1).map(float))


@given(data=st.data())
def test_gradient(data):
    input_dim = data.draw(st.integers(1, 5), "input_dim")
    layer_spec = spec(
        data.draw(st.integers(1, 4), "num_output"),
        input_dim,
        data.draw(st.booleans(), "bias_term"),
        data.draw(testing.fillers(), "weight_filler"),
    )
    x = data.draw(indices(testing.shapes(max_dims=3), input_dim), "x")
    # no gradient flows to the indices: only the weights (repeated rows add up) and bias
    layer = testing.check_layer_gradient(layer_spec, [x])
    assert not layer.allow_force_backward(0)


def test_forward_matches_numpy(xp):
    x = np.array([[0, 3, 3], [1, 0, 2]], np.float64)
    layer, _, tops = run(spec(4, 5), [x], xp)
    W, b = (to_numpy(blob.data) for blob in layer.blobs)
    y = to_numpy(tops[0].data)
    assert y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y, W[x.astype(int)] + b)


def test_backward_accumulates_repeated_rows(xp):
    x = np.array([2.0, 0.0, 2.0, 2.0])
    layer, bs, tops = run(spec(3, 4, bias=False), [x], xp)
    gy = np.arange(12.0).reshape(4, 3)
    tops[0].diff[...] = xp.asarray(gy)
    bs[0].diff[...] = 7
    layer.backward(tops, [True], bs)
    want = np.zeros((4, 3))
    want[2] = gy[0] + gy[2] + gy[3]
    want[0] = gy[1]
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff), want)
    # asked anyway, the index bottom gets the zero gradient of a piecewise constant input
    np.testing.assert_array_equal(to_numpy(bs[0].diff), 0)
    layer.backward(tops, [False], bs)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff), 2 * want)


def test_backward_reads_only_saved_indices():
    layer, bs, tops = run(spec(2, 3), [np.array([1.0, 2.0])])
    assert layer.backward_reads == ()
    bs[0].data[...] = 0  # clobbered after forward: the gradient still goes to rows 1 and 2
    tops[0].diff[...] = 1
    layer.backward(tops, [False], bs)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff), [[0, 0], [1, 1], [1, 1]])


@pytest.mark.parametrize(
    "value, where", [(5.0, r"\(1, 0\)"), (-1.0, r"\(1, 0\)"), (1.5, r"\(1, 0\)"), (np.nan, "")]
)
def test_bad_index_is_an_error(value, where):
    x = np.array([[0.0, 1.0], [value, 2.0]])
    with pytest.raises(NetError, match=rf"layer 'emb' \(Embed\).*{value!r}.*{where}.*\[0, 5\)"):
        run(spec(2, 5), [x])


def test_missing_sizes_are_an_error():
    with pytest.raises(NetError, match=r"layer 'emb' \(Embed\).*input_dim 0"):
        run('name: "emb" type: "Embed" embed_param { num_output: 2 }', [np.zeros(2)])


@given(data=st.data())
def test_the_devices_scatter_add_is_the_cpus_sorted_sum(data):
    """The GPU path (one add.at kernel) and the CPU's sort + reduceat, both run on NumPy."""
    input_dim = data.draw(st.integers(1, 6), "input_dim")
    n = data.draw(st.integers(1, 30), "rows")
    index = np.array(data.draw(st.lists(st.integers(0, input_dim - 1), min_size=n, max_size=n)),
                     np.intp)
    rows = data.draw(hnp.arrays(np.float64, (n, 3), elements=st.floats(-10, 10)), "rows")
    start = data.draw(hnp.arrays(np.float64, (input_dim, 3), elements=st.floats(-10, 10)))
    sorted_sum, scattered = start.copy(), start.copy()
    embed.sorted_add_rows(np, sorted_sum, index, rows)
    embed.scatter_add_rows(np, scattered, index, rows)
    np.testing.assert_allclose(scattered, sorted_sum, rtol=1e-12, atol=1e-12)
    want = start.copy()
    for i, row in zip(index, rows):
        want[i] += row
    np.testing.assert_allclose(sorted_sum, want, rtol=1e-12, atol=1e-12)


def test_on_a_device_forward_and_backward_never_wait_for_it():
    x = np.array([[0.0, 3.0, 3.0], [1.0, 0.0, 2.0]])
    with trace.measure() as counts:
        layer, bs, tops = run(spec(4, 5), [x], trace)
        tops[0].diff[...] = 1.0
        layer.backward(tops, [False], bs)
    assert counts.syncs == 0 and counts.ops["add.at"] == 1
    want = np.zeros((5, 4))
    np.add.at(want, x.astype(int).ravel(), np.ones((6, 4)))
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff), want)


EMBED_NET = """
layer { name: "in" type: "Input" top: "ids" input_param { shape { dim: 2 dim: 2 } } }
layer { name: "emb" type: "Embed" bottom: "ids" top: "v"
        embed_param { num_output: 3 input_dim: 4 } }
layer { name: "emb2" type: "Embed" bottom: "ids" top: "w"
        embed_param { num_output: 2 input_dim: 2 } }
"""


@pytest.mark.parametrize("device", ["cpu", "trace"])
def test_host_ids_are_checked_before_they_go_to_the_device(device):
    net = Net(EMBED_NET, device=device)
    ok = np.array([[0, 1], [1, 0]])
    with trace.measure() as counts:
        net.forward(ids=ok)
    assert counts.syncs == 0
    # every reader checks, through the split: 'emb2' has only 2 rows
    with pytest.raises(NetError, match=r"layer 'emb2' \(Embed\): bottom 'ids' holds 3\.0 at "
                                       r"index \(1, 1\); expected an integer in \[0, 2\)"):
        net.forward(ids=np.array([[0, 1], [1, 3]]))
    with pytest.raises(NetError, match=r"layer 'emb' \(Embed\).*-1\.0 at index \(0, 0\).*"
                                       r"\[0, 4\)"):
        net.check_inputs(ids=np.array([[-1, 0], [0, 0]]))


@pytest.mark.parametrize("device", ["cpu", "trace"])
def test_ids_changed_in_place_before_the_embed_are_checked_as_the_embed_reads_them(device):
    net = Net("""
layer { name: "in" type: "Input" top: "ids" input_param { shape { dim: 3 } } }
layer { name: "clamp" type: "ReLU" bottom: "ids" top: "ids" }
layer { name: "emb" type: "Embed" bottom: "ids" top: "v"
        embed_param { num_output: 2 input_dim: 3 } }""", device=device)
    net.forward(ids=np.array([-1.0, 0.0, 2.0]))  # -1 is clamped to 0 before the lookup
    np.testing.assert_array_equal(to_numpy(net.blobs["v"].data)[0],
                                  to_numpy(net.params["emb"][0].data)[0])
