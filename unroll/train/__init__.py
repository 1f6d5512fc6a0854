"""Training over the nets: solvers, length buckets and packing, bucketed models, MPI.

``solver`` (Caffe's solvers and lr policies, snapshots), ``bucketing`` (the
sampler, pure NumPy), ``bucketed_model`` (one unrolled net per length over one
parameter store), ``distributed`` (data parallel on mpi4py / NCCL), ``model_folder``
(what a trainer writes, in which order, checksummed in log.json).
"""
