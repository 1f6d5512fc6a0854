"""The device switch: NumPy on "cpu", CuPy on "gpu" where one exists, nothing else."""

import numpy as np
import pytest

from unroll.engine import backend
from unroll.engine.backend import (
    GPU_AVAILABLE,
    device_of,
    get_array_module,
    make_rng,
    to_numpy,
)
from unroll.engine.blob import Blob
from unroll.engine.net import Net


def test_cpu_is_numpy():
    assert get_array_module("cpu") is np
    assert get_array_module() is np
    assert device_of(np) == "cpu"


@pytest.mark.skipif(GPU_AVAILABLE, reason="a GPU is present: the error path cannot be reached")
def test_gpu_without_a_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r'device="gpu" needs CuPy and a CUDA device'):
        get_array_module("gpu")
    with pytest.raises(RuntimeError, match="CUDA"):
        Net('layer { name: "x" type: "Input" top: "x" }', device="gpu")


@pytest.mark.parametrize("device", ["tpu", "GPU", "cuda", ""])
def test_unknown_device(device):
    with pytest.raises(ValueError, match=f"unknown device '{device}'"):
        get_array_module(device)
    with pytest.raises(ValueError, match="unknown device"):
        Net('layer { name: "x" type: "Input" top: "x" }', device=device)


def test_cupy_is_imported_only_by_the_backend():
    import pathlib

    package = pathlib.Path(backend.__file__).parent
    importers = [
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if "import cupy" in p.read_text() or "from cupy" in p.read_text()
    ]
    assert importers == ["backend.py"]


def test_device_round_trip(xp):
    device = device_of(xp)
    assert get_array_module(device) is xp
    a = xp.arange(6, dtype=xp.float32).reshape(2, 3)
    host = to_numpy(a)
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_make_rng_is_seeded(xp):
    a = make_rng(xp, 3).random((4,), dtype=xp.float64)
    b = make_rng(xp, 3).random((4,), dtype=xp.float64)
    c = make_rng(xp, 4).random((4,), dtype=xp.float64)
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert not np.array_equal(to_numpy(a), to_numpy(c))


def test_blob_lives_on_the_device(xp):
    blob = Blob((2, 3), xp, np.float64, "b")
    assert isinstance(blob.data, xp.ndarray) and isinstance(blob.diff, xp.ndarray)
    assert blob.reshape((2, 3)) is False
    assert blob.reshape((4,)) is True
    assert blob.shape == (4,) and blob.diff.shape == (4,)
    with pytest.raises(ValueError, match="negative"):
        blob.reshape((-1,))
