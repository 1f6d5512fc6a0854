"""How long OpenBLAS's worker threads spin after a GEMM: set before NumPy loads OpenBLAS.

OpenBLAS reads ``OPENBLAS_THREAD_TIMEOUT`` once, when the library loads; a worker that
finished its part of a GEMM spins for ``2**timeout`` cycles waiting for the next one,
then sleeps until woken. Its default, 28, is about 0.1 s: through every elementwise
layer, Python call and decoder step between a net's GEMMs the worker holds the second
core, and on machines whose cores share their execution units (SMT siblings, or the
virtual CPUs of a VM that are) it slows the thread doing that work: one NumPy add went
from 0.90 to 1.28 µs beside a busy loop on the other core. 20 (about a million cycles,
a few hundred µs) still spans the gap from one GEMM of a timestep to the next, so the
worker is awake for them, and sleeps through longer stretches of other work
(docs/benchmarks.md, "OpenBLAS's spin").

``import unroll`` sets it when it comes before NumPy's import and the user has not set
it; a value of the user's own always wins. It changes timing only: OpenBLAS's results do
not depend on how its threads wait.

>>> env = {"OPENBLAS_THREAD_TIMEOUT": "28"}
>>> default_timeout(env, numpy_loaded=False), env["OPENBLAS_THREAD_TIMEOUT"]
(False, '28')
>>> env = {}
>>> default_timeout(env, numpy_loaded=False), env["OPENBLAS_THREAD_TIMEOUT"]
(True, '20')
"""

from __future__ import annotations

import os
import sys

ENV = "OPENBLAS_THREAD_TIMEOUT"
#: 2**20 cycles: longer than a timestep's gap between GEMMs, far shorter than the default
TIMEOUT = 20


def default_timeout(environ=os.environ, numpy_loaded: bool | None = None) -> bool:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` to :data:`TIMEOUT` in ``environ`` unless it is set
    there; whether this took effect (False: the user's value, or NumPy, hence OpenBLAS,
    already loaded, which reads it only at its load)."""
    if numpy_loaded is None:
        numpy_loaded = "numpy" in sys.modules
    if ENV in environ or numpy_loaded:
        return False
    environ[ENV] = str(TIMEOUT)
    return True


#: whether ``import unroll`` set this process's timeout
applied = default_timeout()
