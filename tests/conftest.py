import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from unroll.engine.backend import GPU_AVAILABLE, get_array_module

_quiet = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
# CI draws the same examples on every run (derandomize), so a red CI reproduces anywhere and
# a green one does not depend on luck; the dev profile draws new ones each run to find bugs
settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          database=None, suppress_health_check=_quiet)
settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=_quiet)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

LAYER_TESTS = Path(__file__).parent / "engine" / "layers"


def pytest_generate_tests(metafunc):
    """Give every test that takes ``xp`` the devices it runs on.

    Layer tests also run on "trace", the counting CuPy stand-in: it refuses implicit host
    conversions as CuPy does, so a layer that passes there has no host/device mix-up left
    for the GPU to find. The GPU case is added everywhere and skips where there is none.
    """
    if "xp" not in metafunc.fixturenames:
        return
    devices = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
    if LAYER_TESTS in Path(metafunc.definition.fspath).parents:
        devices.insert(1, "trace")
    metafunc.parametrize("xp", devices, indirect=True)


@pytest.fixture
def xp(request):
    """The array module under test (see pytest_generate_tests for which devices)."""
    if request.param == "gpu" and not GPU_AVAILABLE:
        pytest.skip("no GPU: CuPy tests run only where a CUDA device is present")
    return get_array_module(request.param)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
