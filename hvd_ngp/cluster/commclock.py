"""Time each rank spends blocked in collectives: the numerator of the communication share.

Definition (what the live line, ``metrics.jsonl`` and TensorBoard call "comm")::

    comm share of a rank = host seconds its loop spent blocked in Horovod collectives
                           / wall seconds of the log interval

"Blocked" is timed on the host around every blocking collective that ``hvd_ngp.cluster.dist`` issues:
the DistributedOptimizer's gradient ``synchronize()`` (called from ``optimizer.step()``), the
occupancy grid's Max-allreduce, the time-budget check. On CUDA the *compute* stream is
synchronised first, so work still queued on the GPU (the backward pass) is not counted as
communication; the host would block at that point anyway, waiting for the gradients, so this adds
no stall of its own. Horovod's own streams are not waited on, so gradient allreduces still in flight
are counted. Allreduces that Horovod overlapped with the backward pass finished before
``synchronize()`` and cost nothing, so they are not counted either. What remains is exposed
communication plus time spent waiting for slower ranks: a straggler makes the *other* ranks'
share grow, and the rank with the lowest share is usually the slow one.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch


class CommClock:
    """Accumulates host seconds spent inside blocking collectives (one per process)."""

    def __init__(self) -> None:
        self.enabled = True
        self.seconds = 0.0
        self.calls = 0

    @contextmanager
    def blocking(self, *tensors: object) -> Iterator[None]:
        """Time the collective in the ``with`` body; ``tensors`` are its inputs (CUDA ones get a stream sync)."""
        if not self.enabled:
            yield
            return
        devices = {t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}
        _sync_compute(devices)
        start = time.perf_counter()
        try:
            yield
        finally:
            # Horovod with HOROVOD_ENABLE_ASYNC_COMPLETION returns before the result is ready and
            # only makes the compute stream wait: include that wait. Otherwise this costs nothing.
            _sync_compute(devices)
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def wrap_synchronize(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Time a Horovod DistributedOptimizer's gradient synchronisation, wherever it is called from."""
        hvd_optimizer: Any = optimizer  # Horovod's DistributedOptimizer class is made at run time: no static type
        inner = hvd_optimizer.synchronize
        devices = {p.device for group in optimizer.param_groups for p in group["params"] if p.is_cuda}
        probes = [torch.empty(0, device=d) for d in devices]

        def synchronize() -> None:
            with self.blocking(*probes):
                inner()

        hvd_optimizer.synchronize = synchronize  # step() calls self.synchronize(): the instance attribute wins
        return optimizer


def _sync_compute(devices: set[torch.device]) -> None:
    for device in devices:
        torch.cuda.current_stream(device).synchronize()


#: the process's clock; ``hvd_ngp.cluster.dist`` feeds it, ``hvd_ngp.observe.monitor`` reads it per log interval
COMM_CLOCK = CommClock()
