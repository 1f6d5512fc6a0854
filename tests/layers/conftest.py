import pytest

from unroll.backend import GPU_AVAILABLE, get_array_module


@pytest.fixture(params=["cpu", "trace", pytest.param("gpu", marks=pytest.mark.gpu)])
def xp(request):
    """The array module under test: NumPy, the counting CuPy stand-in, CuPy where a GPU exists.

    The trace module refuses implicit host conversions as CuPy does, so a layer test that
    passes on "trace" has no host/device mix-up left for the GPU to find.
    """
    if request.param == "gpu" and not GPU_AVAILABLE:
        pytest.skip("no GPU: CuPy tests run only where a CUDA device is present")
    return get_array_module(request.param)
