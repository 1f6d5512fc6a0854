"""Planning a net from its NetParameter, before anything runs: Caffe's rules.

:mod:`unroll.graph.rules` holds names and versions, phase filtering, split
insertion, the in-place proof and need-backward: pure functions of the layers, as
Caffe's ``insert_splits.cpp`` and ``net.cpp`` compute them. The engine builds its
nets from what these return.
"""

from unroll.graph.rules import *  # noqa: F401,F403 (the rules are the package's API)
