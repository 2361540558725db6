"""Allreduce timing: Horovod (as training runs it) against raw ``torch.distributed`` (the ceiling).

Both time the same tensors in the same processes: the largest gradient (the hash grid) alone, and
every gradient of the model in flight together (Horovod fuses them like the optimizer does; the
raw side reduces one flat buffer of the same total size, the best a fused allreduce can do).
Bus bandwidth = 2 (n - 1) / n x bytes / time, NCCL's convention, comparable across rank counts.

``measure_update`` times the two ways to apply one Adam update of all parameters: allreduce the flat
gradient and update every value on every rank (what training does), or reduce-scatter it, update this
rank's 1/n of the values and all-gather them (a sharded optimizer), and checks that both give the same
parameters.
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
    addr, port = dist.broadcast_object((addr, port), name="bench.rendezvous")
    assert addr is not None and port is not None  # rank 0 filled in both before it broadcast them
    return addr, port


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
    largest = max(gradients, key=lambda name: gradients[name])
    total = sum(gradients.values())
    addr, port = _rendezvous(block)
    backend = "nccl" if device.type == "cuda" else "gloo"
    tdist.init_process_group(
        backend, init_method=f"tcp://{addr}:{port}", rank=rt.rank, world_size=rt.size, timeout=timedelta(seconds=120)
    )
    rows = []
    try:
        cases = [
            (f"hash grid ({largest})", [gradients[largest]], gradients[largest]),
            (f"all gradients ({len(gradients)} tensors)", list(gradients.values()), total),
        ]
        for label, numels, flat in cases:
            tensors = [torch.ones(n, device=device) for n in numels]
            buffer = torch.ones(flat, device=device)
            hvd_s = _median_seconds(lambda: dist.allreduce_many_(tensors, "avg", name="bench.ceiling"), device, repeats)
            raw_s = _median_seconds(lambda: tdist.all_reduce(buffer), device, repeats)
            n_bytes = 4 * flat
            hvd_bw = bus_bandwidth_gbs(n_bytes, hvd_s, rt.size)
            raw_bw = bus_bandwidth_gbs(n_bytes, raw_s, rt.size)
            rows.append(
                {
                    "tensor": label,
                    "bytes": n_bytes,
                    "backend": backend,
                    "horovod_s": hvd_s,
                    "raw_s": raw_s,
                    "horovod_busbw_gbs": hvd_bw,
                    "raw_busbw_gbs": raw_bw,
                    "ratio": hvd_bw / raw_bw,
                }
            )
    finally:
        tdist.destroy_process_group()
    return rows


def _adam(param: torch.Tensor) -> torch.optim.Optimizer:
    """Adam as training configures it (fused on a GPU) over one flat parameter."""
    return torch.optim.Adam([param], lr=1e-2, betas=(0.9, 0.99), eps=1e-15, fused=param.is_cuda)


def measure_update(gradients: dict[str, int], repeats: int = 20, seed: int = 0) -> dict | None:
    """Allreduce + Adam on every value against reduce-scatter + Adam on this rank's 1/n + all-gather, over
    one flat fp32 buffer of all ``gradients``' values (padded to a multiple of the rank count): {values,
    bytes, allreduce_update_s, sharded_update_s, speedup (allreduce / sharded), max_difference (largest
    parameter difference after one update both ways from the same start)}; None at size 1.

    Collective: every rank calls it with the same ``gradients``.
    """
    rt = dist.runtime()
    if rt.size == 1:
        return None
    device, n = rt.device, rt.size
    total = -(-sum(gradients.values()) // n) * n
    chunk = total // n
    lo = rt.rank * chunk
    start = torch.randn(total, generator=torch.Generator().manual_seed(seed)).to(device)  # the same on every rank
    grad = torch.randn(total, generator=torch.Generator().manual_seed(seed + 1 + rt.rank)).to(device)

    full = start.clone().requires_grad_(True)
    full_opt = _adam(full)
    shard = start[lo : lo + chunk].clone().requires_grad_(True)
    shard_opt = _adam(shard)
    gathered: list[torch.Tensor] = []

    def allreduce_update() -> None:
        full.grad = dist.allreduce(grad, "avg", name="bench.update.allreduce")
        full_opt.step()

    def sharded_update() -> None:
        shard.grad = dist.reducescatter(grad, "avg", name="bench.update.reducescatter")
        shard_opt.step()
        gathered[:] = [dist.allgather(shard.detach(), name="bench.update.allgather")]

    with torch.no_grad():  # one update each way from the same start: the same parameters
        allreduce_update()
        sharded_update()
        difference = float((gathered[0] - full).abs().max())
        difference = float(dist.allreduce(torch.tensor([difference]), "max", name="bench.update.difference"))
        allreduce_s = _median_seconds(allreduce_update, device, repeats)
        sharded_s = _median_seconds(sharded_update, device, repeats)
    return {
        "values": total,
        "bytes": 4 * total,
        "allreduce_update_s": allreduce_s,
        "sharded_update_s": sharded_s,
        "speedup": allreduce_s / sharded_s,
        "max_difference": difference,
    }
