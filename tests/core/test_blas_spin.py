"""OpenBLAS's spin timeout (docs/design.md, 4. Devices): ``import unroll`` sets it before
NumPy loads OpenBLAS, unless the user set it; results never depend on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from unroll import Net, expand
from unroll.core.blas_spin import ENV, TIMEOUT

REPORT = ("import json, os, sys; {first}; import unroll; "
          "print(json.dumps([unroll.core.blas_spin.applied, os.environ.get('{env}'), "
          "'numpy' in sys.modules]))")


def fresh(first: str = "pass", **env) -> list:
    """What a new interpreter reports after ``first`` and ``import unroll``: whether the
    timeout was set, its value, whether NumPy is loaded."""
    environ = {k: v for k, v in os.environ.items() if k != ENV} | env
    out = subprocess.run([sys.executable, "-c", REPORT.format(first=first, env=ENV)],
                         env=environ, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_import_unroll_sets_the_timeout_before_numpy_is_loaded():
    assert fresh() == [True, str(TIMEOUT), False]


def test_the_users_own_timeout_wins():
    assert fresh(**{ENV: "28"}) == [False, "28", False]


def test_after_numpy_it_is_left_alone_since_openblas_has_read_it():
    assert fresh("import numpy") == [False, None, True]


@pytest.mark.parametrize("timeout", ["4", "28"])
def test_the_timeout_changes_no_result(timeout, tmp_path):
    """An LSTM's forward and backward at two BLAS threads, bit for bit, whatever the
    timeout the process started with."""
    code = ("import numpy as np, unroll\n"
            "from unroll.engine.threads import set_num_threads\n"
            "set_num_threads(2)\n"
            "net = unroll.Net(unroll.expand('lstm', steps=6, batch=33, input_dim=7, hidden=64))\n"
            "rng = np.random.default_rng(0)\n"
            "net.blobs['x'].data[...] = rng.standard_normal(net.blobs['x'].shape)\n"
            "out = net.forward()['h']\n"
            "net.blobs['h'].diff[...] = 1.0\n"
            "net.backward()\n"
            f"np.save({str(tmp_path / 'h.npy')!r}, out)\n"
            f"np.save({str(tmp_path / 'dW.npy')!r}, net.learnable_params[0].blob.diff)\n")
    environ = os.environ | {ENV: timeout}
    subprocess.run([sys.executable, "-c", code], env=environ, check=True)
    net = Net(expand("lstm", steps=6, batch=33, input_dim=7, hidden=64))
    rng = np.random.default_rng(0)
    net.blobs["x"].data[...] = rng.standard_normal(net.blobs["x"].shape)
    out = net.forward()["h"]
    net.blobs["h"].diff[...] = 1.0
    net.backward()
    np.testing.assert_array_equal(np.load(tmp_path / "h.npy"), out)
    np.testing.assert_array_equal(np.load(tmp_path / "dW.npy"), net.learnable_params[0].blob.diff)
