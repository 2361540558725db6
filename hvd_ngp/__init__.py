"""hvd_ngp: a Horovod/MPI distributed trainer for instant-ngp style NeRF.

Importing the package is cheap and never imports Horovod or a GPU backend; see ``hvd_ngp.cluster.dist``
for the distributed runtime and ``hvd_ngp.train`` for the entry point.
"""

__version__ = "0.1.0"
