import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from unroll.backend import GPU_AVAILABLE, get_array_module

_quiet = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=12, deadline=None, suppress_health_check=_quiet)
settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=_quiet)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def xp(request):
    """The array module under test: NumPy always, CuPy where a GPU exists."""
    if request.param == "gpu" and not GPU_AVAILABLE:
        pytest.skip("no GPU: CuPy tests run only where a CUDA device is present")
    return get_array_module(request.param)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
