"""Shared modules: one module template applied to several inputs with ONE set of params.

``{{ shared(...) }}`` renders a module's layers once per application, with the
same param names. The built-in siamese net (two applications of the tower
module) is compared with its unshared twin, in which every application holds
private copies of the params: the same loss, and each owner's diff is the sum
of the copies' diffs.
"""

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import testing
from unroll.core.errors import TemplateError
from unroll.engine.net import Net
from unroll.frontend.unroller import expand
from unroll.tools.cli import main
from unroll.train.solver import Solver

BATCH, DIM = 3, 4
TOWER = ["tower_W_fc1", "tower_b_fc1", "tower_W_out", "tower_b_out"]


def siamese(**hyper):
    return expand("siamese", steps=1, batch=BATCH, input_dim=DIM, hidden=5, embed=3, **hyper)


def pair_inputs(rng, batch=BATCH):
    return {"left": rng.normal(size=(batch, DIM)), "right": rng.normal(size=(batch, DIM)),
            "same": rng.integers(0, 2, batch).astype(float)}


def unshared_twin(net_param):
    """The same net with every application's tower params renamed apart (``W@i``)."""
    twin = type(net_param)()
    twin.CopyFrom(net_param)
    for lp in twin.layer:
        for spec in lp.param:
            if spec.name.startswith("tower_"):
                spec.name = f"{spec.name}@{lp.name.rsplit('_', 1)[1]}"
    return twin


def test_siamese_holds_one_set_of_params():
    net = Net(siamese(), dtype="float64")
    assert [p.name for p in net.learnable_params] == [*TOWER, "W_pair", "b_pair"]
    assert [p.owner for p in net.learnable_params][:4] == [
        "tower_fc1_0", "tower_fc1_0", "tower_out_0", "tower_out_0"]
    for layer in ("tower_fc1", "tower_out"):
        for left, right in zip(net.params[f"{layer}_0"], net.params[f"{layer}_1"]):
            assert np.shares_memory(left.data, right.data)
            assert np.shares_memory(left.diff, right.diff)


@pytest.mark.parametrize("levels", [1, 2, 5])
def test_param_store_does_not_grow_with_the_applications(tmp_path, levels):
    # the same tower at every level of a pyramid
    path = tmp_path / "pyramid.prototxt.j2"
    path.write_text(
        '{% set interface = {"kind": "net", "defaults": {"levels": 1}} %}\n'
        '{% set ns = namespace(xs=[], ys=[]) %}\n'
        '{% for k in range(levels) %}{% set ns.xs = ns.xs + ["x" ~ k] %}'
        '{% set ns.ys = ns.ys + ["y" ~ k] %}{% endfor %}\n'
        'layer { name: "input" type: "Input"\n'
        '{% for x in ns.xs %} top: "{{ x }}"{% endfor %}\n'
        ' input_param { {% for x in ns.xs %} shape { dim: {{ batch }} dim: 4 }{% endfor %} } }\n'
        '{{ shared("tower", ns.xs, ns.ys, scope="level_", depth=2, hidden=6, embed=3) }}\n'
    )
    net = Net(expand(path, steps=1, batch=2, levels=levels))
    one = Net(expand("siamese", steps=1, batch=2, input_dim=4, depth=2, hidden=6, embed=3))
    tower = [p for p in one.learnable_params if p.name.startswith("tower_")]
    assert len(net.store) == len(tower) == 6
    assert net.store.nbytes == sum(p.blob.data.nbytes + p.blob.diff.nbytes for p in tower)
    outputs = net.forward(**{f"x{k}": np.full((2, 4), 0.5) for k in range(levels)})
    # one input, one tower: every level gives the same features
    for k in range(1, levels):
        np.testing.assert_array_equal(outputs[f"y{k}"], outputs["y0"])


@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 2))
def test_owner_diff_is_the_sum_of_the_applications_gradients(seed, depth):
    rng = np.random.default_rng(seed)
    net_param = siamese(depth=depth)
    shared, unshared = Net(net_param, dtype="float64"), Net(unshared_twin(net_param),
                                                              dtype="float64")
    owners = {p.name: p for p in shared.learnable_params}
    for p in unshared.learnable_params:
        p.blob.data[...] = owners[p.name.split("@")[0]].blob.data
    inputs = pair_inputs(rng)
    for net in (shared, unshared):
        net.forward(**inputs)
        net.clear_param_diffs()
        net.backward()
    assert shared.loss == pytest.approx(unshared.loss, rel=1e-12)
    copies = {p.name: p.blob.diff for p in unshared.learnable_params}
    assert len(copies) == len(owners) + 2 * depth + 2
    for name, owner in owners.items():
        # the tower's params have one copy per application; the head's are not shared
        if name.startswith("tower_"):
            total = copies[f"{name}@0"] + copies[f"{name}@1"]
        else:
            total = copies[name]
        np.testing.assert_allclose(owner.blob.diff, total, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("depth", [1, 2])
def test_siamese_gradient_matches_finite_differences(depth, rng):
    net_param = siamese(depth=depth, activation="TanH")
    net_param.force_backward = True
    net = Net(net_param, dtype="float64")
    for name, value in pair_inputs(rng).items():
        net.set_input(name, value)
    testing.check_net_gradient(net, wrt=["left", "right"])


def test_siamese_expands_from_the_command_line_and_learns(tmp_path, rng):
    out = tmp_path / "siamese.prototxt"
    assert main(["expand", "siamese", "--steps", "1", "--set", "batch=16", "--set",
                 "input_dim=4", "-o", str(out)]) == 0
    net = Net(str(out), dtype="float64")
    # a pair is "same" when both points come from one of two clusters
    centres = np.array([[2.0, 0, 0, 0], [-2.0, 0, 0, 0]])

    def batch(_):
        a, b = rng.integers(0, 2, 16), rng.integers(0, 2, 16)
        noise = rng.normal(scale=0.5, size=(2, 16, 4))
        return {"left": centres[a] + noise[0], "right": centres[b] + noise[1],
                "same": (a == b).astype(float)}

    solver = Solver(net, type="Adam", base_lr=0.01, momentum=0.9, momentum2=0.999)
    first = np.mean([solver.step(1, feed=batch) for _ in range(5)])
    solver.step(150, feed=batch)
    last = np.mean([solver.step(1, feed=batch) for _ in range(5)])
    assert last < 0.5 * first


# -- errors ------------------------------------------------------------------------------


def net_template(tmp_path, call: str) -> str:
    path = tmp_path / "net.prototxt.j2"
    path.write_text(
        '{% set interface = {"kind": "net"} %}\n'
        'layer { name: "input" type: "Input" top: "a" top: "b" top: "seq" top: "cont"\n'
        '  input_param { shape { dim: 2 dim: 4 } shape { dim: 2 dim: 4 }\n'
        '                shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } } }\n'
        + call + "\n"
    )
    return str(path)


def module_template(tmp_path, interface: str, body: str, name="mod") -> None:
    (tmp_path / f"{name}.prototxt.j2").write_text(
        "{% set interface = " + interface + " %}\n"
        "{% macro module(s) %}\n" + body + "{% endmacro %}\n"
    )


MODULE = '{"kind": "module", "inputs": ["x"], "outputs": ["y"]}'


def dense(param: str = 'param { name: "{{ s.param(\'W\') }}" } param { name: "b" }',
          top: str = "{{ s.output.y }}") -> str:
    return ('layer { name: "{{ s.layer(\'fc\') }}" type: "InnerProduct" '
            'bottom: "{{ s.input.x }}" top: "' + top + '" ' + param
            + " inner_product_param { num_output: 3 } }\n")


@pytest.mark.parametrize("call, message", [
    ('{{ shared("tower", ["a", "b"], ["c", "d"], scpoe="t_") }}',
     "unknown variable 'scpoe'; did you mean 'scope'?"),
    ('{{ shared("tower", ["a", "b"], ["c"]) }}', "2 bottoms but 1 tops"),
    ('{{ shared("tower", [], []) }}', "bottoms must be a non-empty list"),
    ('{{ shared("tower", "a", "c") }}', "bottoms must be a non-empty list"),
    ('{{ shared("tower", [["a", "b"]], ["c"]) }}',
     "application 0 must give 1 blob name(s) for the module's inputs ['x']"),
    ('{{ shared("tower", ["a"], [["c", "d"]]) }}',
     "application 0 must give 1 blob name(s) for the module's outputs ['y']"),
    ('{{ shared("rnn", ["a"], ["c"], hidden=3) }}',
     "'rnn' is a step template (unroll it with recurrent())"),
    ('{{ shared("tower", ["a"], ["c"], scope="t_") }}{{ shared("tower", ["b"], ["d"], '
     'scope="t_") }}', "scope 't_' is already used by another recurrent() or shared() call"),
    ('{{ shared("tower", ["a"], ["c"], hyper={"hidden": 3}, hidden=4) }}',
     "hidden given both as a keyword and in hyper="),
    ('{{ recurrent("tower", "seq", "h") }}', "'tower' is a module template, not a step"),
    ('{{ shared("tower", ["a", "b"], ["c", "c"]) }}', "blob 'c' is already produced"),
    ('{% set block = shared("tower", ["a"], ["c"]) %}',
     "shared() block 0 is placed 0 times; print each call's result once, where its layers "
     "go: {{ shared(...) }}"),
])
def test_misuse_of_shared_is_a_clear_error(tmp_path, call, message):
    with pytest.raises(TemplateError, match=re.escape(message)):
        expand(net_template(tmp_path, call), steps=3, batch=2)


@pytest.mark.parametrize("interface, body, message", [
    ('{"kind": "module", "inputs": ["x"], "outputs": ["y"], "states": {"h": "n"}, '
     '"defaults": {"n": 2}}', dense(), "a module template has no states"),
    ('{"kind": "module", "inputs": [], "outputs": ["y"]}', dense(),
     "must declare 'inputs', a non-empty list of names"),
    ('{"kind": "module", "inputs": ["x"]}', dense(), "must declare 'outputs'"),
    (MODULE, dense(top="{{ s.blob('y') }}"),
     "mod.prototxt.j2 (application 0): must produce output 'y' (s.output.y, 'c')"),
    (MODULE, dense(param=""), "param 0 of layer 'fc_0' (InnerProduct) has no name"),
    (MODULE, dense(param='param { name: "W{{ s.index }}" } param { name: "b" }'),
     "mod.prototxt.j2 (application 1): param name(s) ['W0', 'W1'] change with the application"),
    (MODULE, dense(top="{{ s.output.y }}_{{ s.t }}"), "mod.prototxt.j2:3: undefined variable: "
     "s.t: a module's s has no 't' (a module has no time and no state"),
    (MODULE, dense(top="{{ s.prev.y }}"), "s.prev: a module's s has no 'prev'"),
    (MODULE, dense(top="{{ s.output.z }}"), "s.output has no 'z' (declared: y)"),
    (MODULE, dense().replace("{{ s.layer('fc') }}", "fc"),
     "mod.prototxt.j2 (application 1): layer name(s) ['fc'] are the same in every application"),
])
def test_bad_module_template_is_a_clear_error(tmp_path, interface, body, message):
    module_template(tmp_path, interface, body)
    call = '{{ shared("mod", ["a", "b"], ["c", "d"]) }}'
    with pytest.raises(TemplateError, match=re.escape(message)):
        expand(net_template(tmp_path, call), steps=3, batch=2, search_path=[tmp_path])


def test_module_without_its_macro_is_a_clear_error(tmp_path):
    (tmp_path / "mod.prototxt.j2").write_text("{% set interface = " + MODULE + " %}\n")
    with pytest.raises(TemplateError, match=r"must define \{% macro module\(s\) %\}"):
        expand(net_template(tmp_path, '{{ shared("mod", ["a"], ["c"]) }}'), steps=1,
               search_path=[tmp_path])


def test_expanding_a_module_alone_points_to_shared():
    with pytest.raises(TemplateError, match=r"tower.prototxt.j2 is a module template.*shared"):
        expand("tower", steps=1)
