"""Weights in Caffe's format, reshaping between runs, devices.

Gradients are checked in float64 against finite differences (``unroll.testing``).
"""

import os

import numpy as np
import pytest

from tests.net_helpers import T2, X, f64, host, inputs, ip, layer, loss, run
from unroll import NetError
from unroll.core.proto import NetParameter, parse_text
from unroll.engine.net import Net

# -- weights: to_proto, copy_from, save ------------------------------------------------

SHARED_IO = (
    inputs(x=(4, 3))
    + ip("ip1", "x", "h1", 3, 'param { name: "w" } param { name: "b" }')
    + ip("ip2", "h1", "h2", 3, 'param { name: "w" } param { name: "b" }')
    + ip("ip3", "h2", "h3", 3, 'param { name: "w" } param { name: "b3" }')
    + ip("ip4", "h3", "y", 2)
)


def test_weights_round_trip_through_a_caffemodel(tmp_path):
    source = f64(SHARED_IO, seed=0)
    path = tmp_path / "snap" / "w.caffemodel"
    source.save(path)
    fresh = f64(SHARED_IO, seed=1)
    assert not np.allclose(fresh.params["ip1"][0].data, source.params["ip1"][0].data)
    fresh.copy_from(str(path))
    for a, b in zip(source.learnable_params, fresh.learnable_params):
        assert a.name == b.name
        np.testing.assert_array_equal(a.blob.data, b.blob.data)
    np.testing.assert_array_equal(fresh.forward(x=X)["y"], source.forward(x=X)["y"])

    # float32 nets write Caffe's float data; a NetParameter loads as well as a path
    single, other = Net(SHARED_IO), Net(SHARED_IO, seed=5)
    other.copy_from(single.to_proto())
    np.testing.assert_array_equal(other.params["ip4"][0].data, single.params["ip4"][0].data)


def test_caffemodel_leaves_out_layers_whose_params_are_all_shared():
    proto = f64(SHARED_IO).to_proto()
    assert [lp.name for lp in proto.layer] == ["ip1", "ip3", "ip4"]
    assert [len(lp.blobs) for lp in proto.layer] == [2, 2, 2]


def test_copy_from_mismatches():
    source = f64(SHARED_IO).to_proto()
    source.layer[2].blobs[0].shape.dim[:] = [1, 6]
    with pytest.raises(NetError, match="'ip4'.*shape"):
        f64(SHARED_IO).copy_from(source)
    other = parse_text(ip("elsewhere", "x", "y", 2), NetParameter())
    other.layer[0].blobs.add().CopyFrom(source.layer[0].blobs[0])
    f64(SHARED_IO).copy_from(other, allow_missing=True)  # layers this net lacks: skipped
    with pytest.raises(NetError, match="'elsewhere'"):
        f64(SHARED_IO).copy_from(other, strict=True)


def test_save_is_atomic(tmp_path, monkeypatch):
    net = f64(SHARED_IO)
    path = tmp_path / "w.caffemodel"
    path.write_bytes(b"previous snapshot")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        net.save(path)
    assert path.read_bytes() == b"previous snapshot"
    assert os.listdir(tmp_path) == ["w.caffemodel"]  # no half-written temp file left
    monkeypatch.undo()
    net.save(path)
    assert os.listdir(tmp_path) == ["w.caffemodel"]
    loaded = NetParameter()
    loaded.ParseFromString(path.read_bytes())
    assert loaded == net.to_proto()


# -- reshape -------------------------------------------------------------------------

RESHAPE = (
    "force_backward: true\n"
    + inputs(x=(4, 3), t=(4, 2))
    + ip("ip", "x", "h", 5)
    + layer("bn", "BatchNorm", "h", "h")
    + layer("relu", "ReLU", "h", "h")
    + ip("ip2", "h", "y", 2)
    + loss("y")
)


def arrays_of(net):
    out = [a for blob in net.blobs.values() for a in (blob.data, blob.diff)]
    return out + [a for p in net.learnable_params for a in (p.blob.data, p.blob.diff)]


def test_forward_with_the_same_shape_allocates_nothing():
    net = f64(RESHAPE, plan_memory=False)
    run(net, x=X, t=T2)
    before = arrays_of(net)
    run(net, x=X * 2, t=T2)
    run(net)
    after = arrays_of(net)
    assert len(before) == len(after)
    assert all(a is b for a, b in zip(before, after))


def test_forward_with_a_new_shape_reallocates_and_works():
    net = f64(RESHAPE)
    run(net, x=X, t=T2)
    x, t = (
        np.random.default_rng(2).normal(size=(7, 3)),
        np.random.default_rng(3).normal(size=(7, 2)),
    )
    out = run(net, x=x, t=t)
    assert net.blobs["y"].shape == (7, 2) and net.blobs["h"].shape == (7, 5)
    fresh = f64(RESHAPE.replace("dim: 4", "dim: 7"))
    fresh.copy_from(net.to_proto())
    # BatchNorm's running statistics differ, but train-phase output uses batch statistics
    assert run(fresh, x=x, t=t) == pytest.approx(out, rel=1e-12)
    np.testing.assert_allclose(net.blobs["x"].diff, fresh.blobs["x"].diff, rtol=1e-10)
    back = run(net, x=X, t=T2)
    assert net.blobs["y"].shape == (4, 2) and np.isfinite(back)


# -- devices --------------------------------------------------------------------------


def test_a_net_gives_the_same_results_on_every_device(xp):
    from unroll.engine.backend import device_of

    text = "force_backward: true\n" + SHARED_IO + ip("head", "y", "p", 2) + loss("p")
    text = text.replace(inputs(x=(4, 3)), inputs(x=(4, 3), t=(4, 2)))
    cpu, net = f64(text), f64(text, device=device_of(xp))
    assert net.xp is xp
    for values in (dict(x=X, t=T2), dict(x=-X, t=T2)):
        assert run(net, **values) == pytest.approx(run(cpu, **values), rel=1e-10)
        np.testing.assert_allclose(host(net.blobs["x"].diff), cpu.blobs["x"].diff, rtol=1e-10)
        for a, b in zip(net.learnable_params, cpu.learnable_params):
            np.testing.assert_allclose(host(a.blob.diff), b.blob.diff, rtol=1e-10, atol=1e-14)
