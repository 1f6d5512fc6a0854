"""Tree nets for BVLC Caffe: the fixed-arity form computes what the SegmentSum form does, in
Caffe's own layer types only (docs/design.md, "Unrolling over trees")."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.frontend.test_caffe_export import SHARED_FIELDS, SHARED_TYPES, caffe_fields, fields_set
from tests.frontend.test_tree_unroller import CHILD_SUM, NARY, batches
from unroll import Net, NetError, to_prototxt
from unroll.core.proto import NetParameter, parse_text
from unroll.frontend.caffe_export import caffe_layer_types
from unroll.frontend.tree_unroller import expand_tree, tree_inputs
from unroll.frontend.unroller import load_template
from unroll.tools import cli


def _run(net_param, x, inputs, dh):
    net_param.force_backward = True
    net = Net(net_param, dtype="float64")
    for p in net.learnable_params:
        p.data[...] = np.random.default_rng(len(p.name)).normal(size=p.data.shape)
    h = net.forward(x=x, **inputs)["h"].copy()
    net.clear_param_diffs()
    net.blobs["h"].diff[...] = dh
    net.backward()
    return h, net.blobs["x"].diff.copy(), {p.name: p.diff.copy() for p in net.learnable_params}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches(max_height=10, max_extra=10), seed=st.integers(0, 9))
def test_the_fixed_arity_form_equals_the_segment_sum_form(case, seed):
    batch, widths, rows, direction = case
    arity = max(t.arity() for t in batch) or 1
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    width = 4 if direction == "bidirectional" else 2
    dh = rng.normal(size=(rows, width))
    template = load_template(CHILD_SUM)
    results = []
    for fixed in (None, arity):
        net_param = expand_tree(CHILD_SUM, widths, input_dim=3, rows=rows, direction=direction,
                                fixed_arity=fixed, hidden=2)
        inputs = tree_inputs(batch, template, widths, direction, rows, fixed_arity=fixed)
        results.append(_run(net_param, x, inputs, dh))
    (h0, gx0, gp0), (h1, gx1, gp1) = results
    np.testing.assert_allclose(h1, h0, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gx1, gx0, rtol=1e-10, atol=1e-12)
    assert gp0.keys() == gp1.keys()
    for name in gp0:
        np.testing.assert_allclose(gp1[name], gp0[name], rtol=1e-10, atol=1e-12)


CAFFE_CASES = [(CHILD_SUM, "up", dict(fixed_arity=3)), (CHILD_SUM, "down", {}),
               (CHILD_SUM, "bidirectional", dict(fixed_arity=2)),
               (NARY, "up", dict(arity=3)), (NARY, "bidirectional", dict(arity=2))]


@pytest.mark.parametrize("template, direction, options", CAFFE_CASES)
def test_tree_nets_export_with_caffe_layer_types_and_fields_only(template, direction, options):
    widths = ((4, 2, 1), (1, 2, 4)) if direction == "bidirectional" else (4, 2, 1)
    net_param = expand_tree(template, widths, input_dim=3, direction=direction, hidden=2,
                            **options)
    text = to_prototxt(net_param, caffe=True)
    exported = parse_text(text, NetParameter())
    assert {lp.type for lp in exported.layer} <= caffe_layer_types()
    if SHARED_TYPES.is_file():
        listed = {line for line in SHARED_TYPES.read_text().splitlines()
                  if line and not line.startswith("#")}
        assert {lp.type for lp in exported.layer} <= listed
    if SHARED_FIELDS.is_file():
        assert fields_set(exported) - caffe_fields() == set()
    Net(exported)


def test_the_segment_sum_form_is_refused_naming_the_fixed_arity_form():
    net_param = expand_tree(CHILD_SUM, (2, 1), input_dim=2, hidden=2)
    with pytest.raises(NetError, match=r"layer 'h_inbox_l0' \(SegmentSum\): a tree net's "
                                       r"child sum .* expand the tree net with fixed_arity=A"):
        to_prototxt(net_param, caffe=True)


def test_unroll_expand_tree_caffe(tmp_path, capsys):
    out = tmp_path / "tree.prototxt"
    status = cli.main(["expand", CHILD_SUM, "--tree", "3,2,1/1,2,3", "--set", "input_dim=4",
                       "--set", "hidden=3", "--set", "fixed_arity=2", "--caffe",
                       "-o", str(out)])
    assert status == 0
    exported = parse_text(out.read_text(), NetParameter())
    assert {lp.type for lp in exported.layer} <= caffe_layer_types()
    assert Net(exported).forward()["h"].shape == (6, 6)
    assert cli.main(["expand", CHILD_SUM, "--tree", "3,x", "--set", "input_dim=4"]) == 2
    assert "--tree '3,x': expected nodes per level" in capsys.readouterr().err
