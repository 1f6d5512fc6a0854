"""Tree nets unrolled level by level equal the per-node recursion (docs/design.md,
"Unrolling over trees"): forward, gradients, sharing, packing, and their errors."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tree_reference import child_sum, nary
from unroll import Net, testing
from unroll.core.errors import TemplateError
from unroll.core.proto import LayerParameter
from unroll.frontend.tree import Tree
from unroll.frontend.tree_unroller import expand_tree, tree_inputs, tree_widths
from unroll.frontend.unroller import load_template

CHILD_SUM, NARY = "child_sum_tree_lstm", "nary_tree_lstm"
MAX_ARITY = 6


@st.composite
def trees(draw, max_height=30, max_extra=12):
    """A tree of height 0..max_height - 1 (a spine of that many nodes below the root) and up
    to max_extra more nodes, no node with more than six children, its nodes shuffled."""
    spine = draw(st.integers(1, max_height))
    parents = [-1] + list(range(spine - 1))
    kids = [1] * (spine - 1) + [0]
    for _ in range(draw(st.integers(0, max_extra))):
        open_ = [j for j, k in enumerate(kids) if k < MAX_ARITY]
        j = draw(st.sampled_from(open_))
        parents.append(j)
        kids[j] += 1
        kids.append(0)
    order = draw(st.permutations(range(len(parents))))
    new = {old: k for k, old in enumerate(order)}
    shuffled = [0] * len(parents)
    for old, p in enumerate(parents):
        shuffled[new[old]] = -1 if p < 0 else new[p]
    return Tree(shuffled)


@st.composite
def batches(draw, max_height=30, max_extra=12, max_trees=3):
    """(trees, widths padded by 0..2 slots a level, rows padded by 0..2, direction, kind)."""
    batch = draw(st.lists(trees(max_height, max_extra), min_size=1, max_size=max_trees))
    direction = draw(st.sampled_from(["up", "down", "bidirectional"]))
    real = tree_widths(batch, direction)

    def pad(ws):
        return tuple(w + draw(st.integers(0, 2)) for w in ws)

    widths = (pad(real[0]), pad(real[1])) if direction == "bidirectional" else pad(real)
    slots = max(sum(w) for w in widths) if direction == "bidirectional" else sum(widths)
    rows = max(slots, sum(len(t) for t in batch)) + draw(st.integers(0, 2))
    return batch, widths, rows, direction


def _net(template, widths, rows, direction, dim, hidden, dtype="float64", **hyper):
    net_param = expand_tree(template, widths, input_dim=dim, rows=rows, direction=direction,
                            hidden=hidden, **hyper)
    return Net(net_param, dtype=dtype)


def _params(net):
    return {p.name: p.data for p in net.learnable_params}


def _reference(template, x, batch, params, direction, arity):
    """Each tree alone through the recursion, rows back to back (bidirectional: side by side)."""
    dirs = [("up", "up_"), ("down", "down_")] if direction == "bidirectional" else [
        (direction, "")]
    out, start = [], 0
    for t in batch:
        xs = x[start: start + len(t)]
        parts = [child_sum(xs, t.parents, params, d, sc) if template == CHILD_SUM else
                 nary(xs, t.parents, params, arity, d, sc) for d, sc in dirs]
        out.append(np.concatenate(parts, axis=1))
        start += len(t)
    return np.concatenate(out)


def _filled(net, template, batch, widths, rows, direction, rng, arity=None, dim=3):
    hyper = {"arity": arity} if template == NARY else {}
    inputs = tree_inputs(batch, load_template(template), widths, direction, rows, hyper=hyper)
    x = rng.normal(size=(rows, dim))
    return x, inputs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches(), template=st.sampled_from([CHILD_SUM, NARY]), seed=st.integers(0, 99))
def test_level_batched_forward_equals_the_per_node_recursion(case, template, seed):
    batch, widths, rows, direction = case
    arity = MAX_ARITY if template == NARY else None
    hyper = {"arity": arity} if template == NARY else {}
    net = _net(template, widths, rows, direction, 3, 4, **hyper)
    rng = np.random.default_rng(seed)
    for p in net.learnable_params:
        p.data[...] = rng.normal(scale=0.5, size=p.data.shape)
    x, inputs = _filled(net, template, batch, widths, rows, direction, rng, arity)
    h = net.forward(x=x, **inputs)["h"]
    want = _reference(template, x, batch, _params(net), direction, arity)
    np.testing.assert_allclose(h[: len(want)], want, rtol=1e-10, atol=1e-12)


def _with_loss(net_param, rows, width):
    """The tree net with a EuclideanLoss of h against a target input, forcing backward."""
    net_param.force_backward = True
    lp = LayerParameter(name="target_in", type="Input", top=["target"])
    lp.input_param.shape.add().dim.extend([rows, width])
    net_param.layer.insert(0, lp)
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"], top=["loss"])
    return net_param


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches(max_extra=6, max_trees=2), template=st.sampled_from([CHILD_SUM, NARY]),
       seed=st.integers(0, 99))
def test_gradients_equal_finite_differences(case, template, seed):
    batch, widths, rows, direction = case
    hidden, arity = 2, (3 if template == NARY else None)
    if template == NARY and max(t.arity() for t in batch) > arity:
        arity = max(t.arity() for t in batch)
    hyper = {"arity": arity} if template == NARY else {}
    width = hidden * (2 if direction == "bidirectional" else 1)
    net_param = _with_loss(expand_tree(template, widths, input_dim=2, rows=rows,
                                       direction=direction, hidden=hidden, **hyper), rows, width)
    net = Net(net_param, dtype="float64")
    rng = np.random.default_rng(seed)
    x, inputs = _filled(net, template, batch, widths, rows, direction, rng, arity, dim=2)
    net.forward(x=x, target=rng.normal(size=(rows, width)), **inputs)
    testing.check_net_gradient(net, wrt=["x"], rtol=1e-4, atol=1e-7)


def _unshared(net_param):
    """A copy of ``net_param`` whose every layer has params of its own: each param name gets
    the level suffix of its layer (``_l3``, ``_e3``)."""
    copy = type(net_param)()
    copy.CopyFrom(net_param)
    for lp in copy.layer:
        for spec in lp.param:
            spec.name = f"{spec.name}@{lp.name.rsplit('_', 1)[-1]}"
    return copy


@pytest.mark.parametrize("template, direction", [(CHILD_SUM, "up"), (CHILD_SUM, "down"),
                                                 (NARY, "up"), (NARY, "bidirectional")])
def test_shared_params_accumulate_the_gradient_of_every_node(template, direction):
    batch = [Tree.from_heads([2, 0, 2, 3, 3, 3]), Tree.from_heads([0, 1])]
    widths = tree_widths(batch, direction)
    hyper = {"arity": 3} if template == NARY else {}
    rows = max(sum(w) for w in widths) if direction == "bidirectional" else sum(widths)
    width = 4 if direction == "bidirectional" else 2
    shared_param = _with_loss(expand_tree(template, widths, input_dim=3, rows=rows,
                                          direction=direction, hidden=2, **hyper), rows, width)
    shared = Net(shared_param, dtype="float64")
    unshared = Net(_unshared(shared_param), dtype="float64")
    rng = np.random.default_rng(0)
    for p in shared.learnable_params:
        p.data[...] = rng.normal(size=p.data.shape)
    for p in unshared.learnable_params:
        p.data[...] = shared.store[p.name.split("@")[0]].data
    x, inputs = _filled(shared, template, batch, widths, rows, direction, rng,
                        hyper.get("arity"))
    target = rng.normal(size=(rows, width))
    for net in (shared, unshared):
        net.forward(x=x, target=target, **inputs)
        net.clear_param_diffs()
        net.backward()
    assert len(unshared.learnable_params) > len(shared.learnable_params)
    for p in shared.learnable_params:
        copies = [q.diff for q in unshared.learnable_params if q.name.split("@")[0] == p.name]
        assert len(copies) > 1, p.name  # used by several levels
        np.testing.assert_allclose(p.diff, np.sum(copies, axis=0), rtol=1e-12, atol=1e-14)
        assert np.abs(p.diff).max() > 0, p.name


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches(max_height=12, max_trees=4), template=st.sampled_from([CHILD_SUM, NARY]))
def test_a_batch_of_trees_equals_each_tree_alone(case, template):
    batch, widths, rows, direction = case
    hyper = {"arity": MAX_ARITY} if template == NARY else {}
    rng = np.random.default_rng(1)
    net = _net(template, widths, rows, direction, 3, 3, **hyper)
    for p in net.learnable_params:
        p.data[...] = rng.normal(scale=0.5, size=p.data.shape)
    x, inputs = _filled(net, template, batch, widths, rows, direction, rng, hyper.get("arity"))
    together = net.forward(x=x, **inputs)["h"].copy()
    start = 0
    for t in batch:
        alone_widths = tree_widths([t], direction)
        alone = _net(template, alone_widths, None, direction, 3, 3, **hyper)
        for p in alone.learnable_params:
            p.data[...] = net.store[p.name].data
        alone_rows = alone.blobs["x"].shape[0]
        xs = np.zeros((alone_rows, 3))
        xs[: len(t)] = x[start: start + len(t)]
        got = alone.forward(x=xs, **tree_inputs([t], load_template(template), alone_widths,
                                                direction, hyper=hyper))["h"]
        np.testing.assert_allclose(together[start: start + len(t)], got[: len(t)],
                                   rtol=1e-12, atol=1e-14)
        start += len(t)


def test_one_net_serves_every_batch_of_its_widths():
    """The structure is in the inputs, not the net: two batches with other trees, same widths."""
    a = [Tree.from_heads([0, 1, 1]), Tree.from_heads([2, 0])]  # up widths (3, 2)
    b = [Tree.from_heads([2, 0, 2]), Tree.from_heads([0, 1])]
    assert tree_widths(a, "up") == tree_widths(b, "up")
    net = _net(CHILD_SUM, (3, 2), 5, "up", 2, 2)
    for p in net.learnable_params:
        p.data[...] = np.random.default_rng(2).normal(size=p.data.shape)
    x = np.random.default_rng(3).normal(size=(5, 2))
    for batch in (a, b):
        h = net.forward(x=x, **tree_inputs(batch, load_template(CHILD_SUM), (3, 2), "up"))["h"]
        np.testing.assert_allclose(h, _reference(CHILD_SUM, x, batch, _params(net), "up", None))


@pytest.mark.parametrize("parents, message", [
    ([1, 0], r"no root"),
    ([-1, -1, 0], r"several roots, nodes \[0, 1\]"),
    ([-1, 5], r"node 1 has parent 5, outside -1\.\.1 \(as a CoNLL-U head: 6, outside 0\.\.2\)"),
    ([-1, 2, 3, 1], r"nodes \[1, 2, 3\] form a cycle"),
    ([], r"at least one node"),
])
def test_bad_trees_are_errors_naming_the_node(parents, message):
    with pytest.raises(ValueError, match=message):
        Tree(np.array(parents, dtype=np.int64), where="s.conllu:7")


def test_a_node_with_more_children_than_the_arity_is_an_error():
    t = Tree.from_heads([0, 1, 1, 1], where="s.conllu:3")
    with pytest.raises(ValueError, match=r"s\.conllu:3: node 0 has more than 2 children, but "
                                         r"the net was expanded with arity 2"):
        tree_inputs([t], load_template(NARY), tree_widths([t], "up"), "up", hyper={"arity": 2})


def test_widths_that_do_not_hold_the_batch_are_an_error():
    t = Tree.from_heads([0, 1, 1])
    with pytest.raises(ValueError, match=r"level widths \(1, 1\) do not hold the batch's \(2, 1\)"):
        tree_inputs([t], load_template(CHILD_SUM), (1, 1), "up")


def test_template_errors_name_the_template(tmp_path):
    path = tmp_path / "bad.prototxt.j2"
    path.write_text('{% set interface = {"kind": "tree_step", "children": "sum", "inputs": ["x"],'
                    ' "states": {"h": "n"}, "messages": {"h": "n"}, "outputs": ["h"],'
                    ' "defaults": {"n": 2}} %}{% macro node(s) %}{% endmacro %}')
    with pytest.raises(TemplateError, match=r"bad\.prototxt\.j2: a tree_step template with "
                                            r"children 'sum' must define \{% macro edge\(s\) %\}"):
        expand_tree(str(path), (1,), input_dim=1)
    path.write_text(path.read_text().replace("{% macro node(s) %}",
                                             "{% macro edge(s) %}{% endmacro %}"
                                             "{% macro node(s) %}"))
    with pytest.raises(TemplateError, match=r"the node macro at level 0 must produce state 'h'"):
        expand_tree(str(path), (1,), input_dim=1)
    with pytest.raises(TemplateError, match=r"is a step template; expand_tree takes a tree_step"):
        expand_tree("lstm", (1,), input_dim=1, hidden=2)


def test_a_tree_template_reading_what_a_tree_step_lacks_names_its_line(tmp_path):
    source = (load_template(CHILD_SUM).path.read_text()
              .replace('bottom: "{{ s.inbox.h }}"', 'bottom: "{{ s.cont }}"', 1))
    path = tmp_path / "mine.prototxt.j2"
    path.write_text(source)
    line = source[: source.index("s.cont")].count("\n") + 1
    with pytest.raises(TemplateError, match=rf"mine\.prototxt\.j2:{line}: undefined variable: "
                                            r"s\.cont: a tree step's s has no 'cont'"):
        expand_tree(str(path), (1,), input_dim=2, hidden=2)
