"""OpenBLAS's spin timeout (docs/design.md, 4. Devices): ``import unroll`` sets it before
NumPy loads OpenBLAS, unless the user set it; results never depend on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

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


def test_the_timeout_changes_no_result(tmp_path):
    """An LSTM's forward and backward at two BLAS threads, bit for bit, in a process that
    started with the shortest timeout and in one that started with OpenBLAS's default."""
    code = ("import sys, numpy as np, unroll\n"
            "from unroll.engine.threads import set_num_threads\n"
            "set_num_threads(2)\n"
            "net = unroll.Net(unroll.expand('lstm', steps=6, batch=33, input_dim=7, hidden=64))\n"
            "net.blobs['x'].data[...] = np.random.default_rng(0).standard_normal((6, 33, 7))\n"
            "h = net.forward()['h'].copy()\n"
            "net.blobs['h'].diff[...] = 1.0\n"
            "net.backward()\n"
            "np.savez(sys.argv[1], h=h, dW=net.learnable_params[0].blob.diff)\n")
    found = []
    for timeout in ("4", "28"):
        path = tmp_path / f"{timeout}.npz"
        subprocess.run([sys.executable, "-c", code, str(path)], env=os.environ | {ENV: timeout},
                       check=True)
        found.append(np.load(path))
    for name in ("h", "dW"):
        np.testing.assert_array_equal(found[0][name], found[1][name])
