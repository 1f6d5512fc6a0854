import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unroll import Net, NetError
from unroll.engine import trace
from unroll.engine.backend import to_numpy
from unroll.testing import arrays, check_layer_gradient, distinct_arrays, shapes
from unroll.testing import run_layer as run

with_xp = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)




def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@st.composite
def scored_labels(draw, min_dims=2):
    """(scores, axis, labels of shape outer x inner, C)."""
    shape = draw(shapes(min_dims=min_dims, max_dims=3, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    a = axis % len(shape)
    classes = shape[a]
    label_shape = (math.prod(shape[:a]), math.prod(shape[a + 1:]))
    labels = draw(st.lists(st.integers(0, classes - 1), min_size=math.prod(label_shape),
                           max_size=math.prod(label_shape)))
    scores = draw(arrays(shape, -3, 3))
    return scores, axis, np.array(labels, np.float64).reshape(label_shape), classes


# -- Softmax ------------------------------------------------------------------


@with_xp
@given(x=arrays(shapes(max_dims=3)), data=st.data())
def test_softmax_forward_and_gradient(xp, x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    spec = f'name: "sm" type: "Softmax" softmax_param {{ axis: {axis} }}'
    _, _, tops = run(spec, [x], xp)
    np.testing.assert_allclose(to_numpy(tops[0].data), np_softmax(x, axis), rtol=1e-12)
    check_layer_gradient(spec, [x], xp=xp)


def test_softmax_is_stable_for_huge_scores():
    _, _, tops = run('type: "Softmax"', [np.array([[1e4, 1e4 - 1, -1e4]])])
    np.testing.assert_allclose(tops[0].data, [[1 / (1 + np.exp(-1)), 1 / (1 + np.e), 0]])


# -- SoftmaxWithLoss ----------------------------------------------------------

MODES = ["", "normalization: VALID", "normalization: FULL", "normalization: BATCH_SIZE",
         "normalization: NONE", "normalize: true", "normalize: false"]


def reference_loss(scores, axis, labels, ignore, mode):
    axis %= scores.ndim
    classes = scores.shape[axis]
    logp = np.log(np_softmax(scores, axis))
    logp = np.moveaxis(logp, axis, -1).reshape(labels.shape[0], -1, classes)
    valid = labels != ignore if ignore is not None else np.ones(labels.shape, bool)
    picked = np.take_along_axis(logp, np.where(valid, labels, 0).astype(int)[..., None], -1)
    total = -(picked[..., 0] * valid).sum()
    count = {"": valid.sum() if ignore is not None else labels.size,
             "normalization: VALID": valid.sum() if ignore is not None else labels.size,
             "normalize: true": valid.sum() if ignore is not None else labels.size,
             "normalization: FULL": labels.size,
             "normalization: BATCH_SIZE": labels.shape[0], "normalize: false": labels.shape[0],
             "normalization: NONE": 1}[mode]
    return total / max(count, 1)


@with_xp
@given(case=scored_labels(), mode=st.sampled_from(MODES), data=st.data())
def test_softmax_loss_forward_and_gradient(xp, case, mode, data):
    scores, axis, labels, classes = case
    ignore = data.draw(st.none() | st.integers(-1, classes - 1))
    loss_param = mode + (f" ignore_label: {ignore}" if ignore is not None else "")
    spec = (f'name: "loss" type: "SoftmaxWithLoss" softmax_param {{ axis: {axis} }} '
            f"loss_param {{ {loss_param} }}")
    _, _, tops = run(spec, [scores, labels], xp)
    assert tops[0].shape == ()
    want = reference_loss(scores, axis, labels, ignore, mode)
    np.testing.assert_allclose(float(to_numpy(tops[0].data)), want, rtol=1e-10, atol=1e-12)
    check_layer_gradient(spec, [scores, labels], xp=xp)


@with_xp
@given(case=scored_labels())
def test_softmax_loss_second_top_is_the_softmax(xp, case):
    scores, axis, labels, _ = case
    spec = f'type: "SoftmaxWithLoss" top: "loss" top: "prob" softmax_param {{ axis: {axis} }}'
    _, _, tops = run(spec, [scores, labels], xp, n_tops=2)
    np.testing.assert_allclose(to_numpy(tops[1].data), np_softmax(scores, axis), rtol=1e-12)


def test_softmax_loss_all_ignored_is_zero_not_nan(xp):
    spec = 'type: "SoftmaxWithLoss" loss_param { ignore_label: 2 }'
    layer, bottoms, tops = run(spec, [np.ones((3, 4)), np.full(3, 2.0)], xp)
    assert float(to_numpy(tops[0].data)) == 0.0
    tops[0].diff[...] = 1.0
    layer.backward(tops, [True, False], bottoms)
    assert not to_numpy(bottoms[0].diff).any()


def test_softmax_loss_is_stable_for_huge_scores():
    _, _, tops = run('type: "SoftmaxWithLoss"', [np.array([[1e4, -1e4]]), np.array([1.0])])
    assert float(tops[0].data) == pytest.approx(2e4)


def test_softmax_loss_labels_get_no_gradient():
    layer, _, _ = run('type: "SoftmaxWithLoss"', [np.zeros((2, 3)), np.zeros(2)])
    assert layer.is_loss and layer.allow_force_backward(0) and not layer.allow_force_backward(1)


@pytest.mark.parametrize(
    "spec, scores, labels, match",
    [
        ('name: "l1" type: "SoftmaxWithLoss"', (2, 3), [0, 3], r"l1.*label 3 .*\[0, 3\)"),
        ('name: "l2" type: "SoftmaxWithLoss" loss_param { ignore_label: -1 }', (2, 3), [-2, -1],
         "l2.*label -2"),
        ('name: "l3" type: "SoftmaxWithLoss"', (2, 3), [0, 1, 2], "l3.*3 entries"),
        ('name: "l4" type: "SoftmaxWithLoss" softmax_param { axis: 2 }', (2, 3), [0, 1], "l4"),
        ('name: "a1" type: "Accuracy"', (2, 3), [0, 5], "a1.*label 5"),
        ('name: "a2" type: "Accuracy" accuracy_param { top_k: 4 }', (2, 3), [0, 1], "a2.*top_k"),
        ('name: "a3" type: "Accuracy"', (2, 3), [[0], [1], [2]], "a3"),
    ],
)
def test_bad_labels_name_the_layer(spec, scores, labels, match):
    with pytest.raises(NetError, match=match):
        run(spec, [np.zeros(scores), np.array(labels, np.float64)])


TAGS_NET = """
layer { name: "in" type: "Input" top: "scores" top: "labels"
        input_param { shape { dim: 2 dim: 3 dim: 4 } shape { dim: 2 dim: 3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "scores" bottom: "labels" top: "loss"
        loss_param { ignore_label: -1 } softmax_param { axis: 2 } }
layer { name: "acc" type: "Accuracy" bottom: "scores" bottom: "labels" top: "acc"
        accuracy_param { axis: 2 } }
"""


@pytest.mark.parametrize("device", ["cpu", "trace"])
@pytest.mark.parametrize("bad, match", [
    (4, r"layer 'loss' \(SoftmaxWithLoss\): label 4 in 'labels' is out of range \[0, 4\) "
        r"for 4 classes \(ignore_label is -1\)"),
    (0.5, r"layer 'loss' \(SoftmaxWithLoss\): label 0\.5 in 'labels' is not a whole number"),
    (np.nan, r"label nan in 'labels' is not a whole number"),
    (-1, r"layer 'acc' \(Accuracy\): label -1 in 'labels' is out of range"),  # acc ignores none
])
def test_host_labels_are_checked_before_they_go_to_the_device(device, bad, match):
    net = Net(TAGS_NET, device=device)
    scores = np.zeros((2, 3, 4))
    labels = np.array([[0, 1, 2], [3, 0, 1]], np.float64)
    with trace.measure() as counts:
        net.forward(scores=scores, labels=labels)
    assert counts.syncs == 0
    labels[1, 2] = bad
    with pytest.raises(NetError, match=match):
        net.forward(scores=scores, labels=labels)


def test_labels_on_a_device_are_used_unchecked_without_a_wait():
    """A device array (a packed batch) was checked on the host before its transfer."""
    layer, bottoms, tops = run('type: "SoftmaxWithLoss" loss_param { ignore_label: -1 }',
                               [np.zeros((2, 3)), np.array([2.0, -1.0])], trace)
    with trace.measure() as counts:
        layer.forward(bottoms, tops)
        tops[0].diff[...] = 1.0
        layer.backward(tops, [True, False], bottoms)
    assert counts.syncs == 0
    assert float(to_numpy(tops[0].data)) == pytest.approx(math.log(3))


# -- EuclideanLoss ------------------------------------------------------------


@with_xp
@given(shape=shapes(max_dims=3), data=st.data())
def test_euclidean_loss_forward_and_gradient(xp, shape, data):
    a, b = data.draw(arrays(shape)), data.draw(arrays(shape))
    b = b.reshape(shape[0], -1) if data.draw(st.booleans()) else b  # same count suffices
    spec = 'name: "l2" type: "EuclideanLoss"'
    layer, _, tops = run(spec, [a, b], xp)
    assert layer.is_loss and tops[0].shape == ()
    want = ((a - b.reshape(shape)) ** 2).sum() / (2 * shape[0])
    np.testing.assert_allclose(float(to_numpy(tops[0].data)), want, rtol=1e-12)
    check_layer_gradient(spec, [a, b], xp=xp)


def test_euclidean_loss_needs_matching_bottoms():
    with pytest.raises(NetError, match="'e'"):
        run('name: "e" type: "EuclideanLoss"', [np.zeros((2, 3)), np.zeros((3, 2))])


@pytest.mark.parametrize("input_param", ["", "input_param { shape { dim: 0 } }",
                                         "input_param { shape { dim: 4 } shape { dim: 4 } }"])
def test_euclidean_loss_chunk_needs_the_whole_length(input_param):
    with pytest.raises(NetError, match=r"layer 'e' \(EuclideanLossChunk\): input_param needs "
                                       r"one shape .* \(>= 1\), found shapes \["):
        run(f'name: "e" type: "EuclideanLossChunk" {input_param}',
            [np.zeros((1, 2)), np.zeros((1, 2))])


# -- Accuracy -----------------------------------------------------------------


def reference_accuracy(scores, axis, labels, top_k, ignore):
    axis %= scores.ndim
    x = np.moveaxis(scores, axis, -1).reshape(labels.shape[0], -1, scores.shape[axis])
    lab = labels.astype(int)
    valid = lab != ignore if ignore is not None else np.ones(lab.shape, bool)
    true = np.take_along_axis(x, np.where(valid, lab, 0)[..., None], -1)
    hit = valid & ((x >= true).sum(-1) <= top_k)  # ties count against the true class
    per_class = [hit[valid & (lab == c)].mean() if (valid & (lab == c)).any() else 0.0
                 for c in range(x.shape[-1])]
    return (hit.sum() / valid.sum() if valid.any() else 0.0), per_class


@st.composite
def accuracy_cases(draw):
    shape = draw(shapes(min_dims=2, max_dims=3, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    classes = shape[axis]
    outer_inner = math.prod(shape) // classes
    labels = draw(st.lists(st.integers(0, classes - 1), min_size=outer_inner,
                           max_size=outer_inner))
    a = axis % len(shape)
    labels = np.array(labels, np.float64).reshape(math.prod(shape[:a]), -1)
    # distinct scores, or few levels so that ties happen
    scores = draw(distinct_arrays(shape) | arrays(shape).map(np.round))
    top_k = draw(st.integers(1, classes))
    ignore = draw(st.none() | st.integers(-1, classes - 1))
    return scores, axis, labels, top_k, ignore


@with_xp
@given(case=accuracy_cases())
def test_accuracy_forward(xp, case):
    scores, axis, labels, top_k, ignore = case
    param = f"axis: {axis} top_k: {top_k}" + (f" ignore_label: {ignore}" if ignore is not None
                                                else "")
    spec = f'type: "Accuracy" top: "acc" top: "per_class" accuracy_param {{ {param} }}'
    _, _, tops = run(spec, [scores, labels], xp, n_tops=2)
    want, per_class = reference_accuracy(scores, axis, labels, top_k, ignore)
    assert tops[0].shape == ()
    np.testing.assert_allclose(float(to_numpy(tops[0].data)), want, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(tops[1].data), per_class, rtol=1e-12)


def test_accuracy_examples():
    scores = np.array([[0.1, 0.5, 0.4], [0.3, 0.3, 0.4], [0.9, 0.0, 0.1], [0.2, 0.2, 0.6]])
    labels = np.array([2, 0, 0, 1.0])
    cases = [("top_k: 1", 1 / 4), ("top_k: 2", 2 / 4), ("top_k: 3", 1.0),
             ("top_k: 1 ignore_label: 1", 1 / 3), ("top_k: 2 ignore_label: 0", 1 / 2)]
    for param, want in cases:
        _, _, tops = run(f'type: "Accuracy" accuracy_param {{ {param} }}', [scores, labels])
        assert float(tops[0].data) == pytest.approx(want), param
    # a tie with the true class counts against it, as in Caffe
    _, _, tops = run('type: "Accuracy"', [np.array([[1.0, 1.0]]), np.array([0.0])])
    assert float(tops[0].data) == 0.0


def test_accuracy_backward_writes_zero_and_never_raises():
    layer, bottoms, tops = run('type: "Accuracy"', [np.ones((2, 3)), np.zeros(2)])
    bottoms[0].diff[...] = 7.0
    layer.backward(tops, [True, True], bottoms)
    assert not bottoms[0].diff.any() and not bottoms[1].diff.any()
    assert not layer.allow_force_backward(0) and not layer.allow_force_backward(1)
