"""The ground every part stands on: errors, atomic file writes, bounded and schema-checked
JSON (``json_files``), Caffe's protobuf messages, and OpenBLAS's spin timeout
(``blas_spin``, set by ``import unroll`` before NumPy loads).

Nothing here knows about nets or templates; every other package may import it.
"""
