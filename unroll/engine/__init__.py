"""The net engine: blobs, layers, the Net that runs them with Caffe's semantics, memory.

``layer`` and ``layers/`` (the registry and one module per layer family), ``net``
(build a planned graph, run it forward and backward, share params by name),
``param_store`` and ``workspace`` (the memory nets share), ``weights``
(.caffemodel I/O), ``backend``, ``trace`` and ``kernels/`` (NumPy, CuPy, the
counting stand-in, numba and CuPy units), ``threads`` (BLAS threads per run).
It imports only :mod:`unroll.core` and :mod:`unroll.graph`.
"""
