"""Allreduce timing: Horovod (as training runs it) against raw ``torch.distributed`` (the ceiling).

Both time the same tensors in the same processes: the largest gradient (the hash grid) alone, and
every gradient of the model in flight together (Horovod fuses them like the optimizer does; the
raw side reduces one flat buffer of the same total size, the best a fused allreduce can do).
Bus bandwidth = 2 (n - 1) / n x bytes / time, NCCL's convention, comparable across rank counts.
"""

from __future__ import annotations

import socket
import statistics
import time
from datetime import timedelta
from typing import Callable

import torch

from ..cluster import dist
from ..cluster.comm import DistributedBlock


def bus_bandwidth_gbs(n_bytes: int, seconds: float, size: int) -> float:
    return 2 * (size - 1) / size * n_bytes / seconds / 1e9


def _median_seconds(fn: Callable[[], None], device: torch.device, repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``fn`` (device idle before, finished after)."""
    times = []
    for i in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rendezvous(block: DistributedBlock) -> tuple[str, int]:
    """torch.distributed's address: the config's master_addr/master_port, else rank 0's host and a free port."""
    addr, port = block.master_addr, block.master_port
    if dist.runtime().is_root and (addr is None or port is None):
        addr = addr or socket.gethostname()
        if port is None:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
    return dist.broadcast_object((addr, port), name="bench.rendezvous")


def measure(gradients: dict[str, int], block: DistributedBlock, repeats: int = 20) -> list[dict]:
    """Rows {tensor, bytes, horovod_s, raw_s, horovod_busbw_gbs, raw_busbw_gbs, ratio}; [] at size 1.

    ``gradients``: parameter name -> number of fp32 values (every rank passes the same).
    Collective: every rank calls it.
    """
    rt = dist.runtime()
    if rt.size == 1:
        return []
    import torch.distributed as tdist

    device = rt.device
    largest = max(gradients, key=gradients.get)
    total = sum(gradients.values())
    addr, port = _rendezvous(block)
    backend = "nccl" if device.type == "cuda" else "gloo"
    tdist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rt.rank, world_size=rt.size,
                             timeout=timedelta(seconds=120))
    rows = []
    try:
        cases = [(f"hash grid ({largest})", [gradients[largest]], gradients[largest]),
                 (f"all gradients ({len(gradients)} tensors)", list(gradients.values()), total)]
        for label, numels, flat in cases:
            tensors = [torch.ones(n, device=device) for n in numels]
            buffer = torch.ones(flat, device=device)
            hvd_s = _median_seconds(lambda: dist.allreduce_many_(tensors, "avg", name="bench.ceiling"), device, repeats)
            raw_s = _median_seconds(lambda: tdist.all_reduce(buffer), device, repeats)
            n_bytes = 4 * flat
            hvd_bw = bus_bandwidth_gbs(n_bytes, hvd_s, rt.size)
            raw_bw = bus_bandwidth_gbs(n_bytes, raw_s, rt.size)
            rows.append({"tensor": label, "bytes": n_bytes, "backend": backend, "horovod_s": hvd_s, "raw_s": raw_s,
                         "horovod_busbw_gbs": hvd_bw, "raw_busbw_gbs": raw_bw, "ratio": hvd_bw / raw_bw})
    finally:
        tdist.destroy_process_group()
    return rows
