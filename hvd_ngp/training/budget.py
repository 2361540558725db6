"""The ray budget: the one owner of this rank's ray count, its sample target and the fast renderer's capacities.

Per step, ``update`` adapts the ray count to the samples the last step carried; per log interval,
``follow`` takes the load balancer's decision (``data.balance``: equal rays, or a sample target and
a sample capacity per rank). The fast renderer reads its buffer sizes from here
(``render.fast.FastRenderer.following``), so nothing else sets them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..config import RAY_COUNT_MULTIPLE
from .step import StepResult

if TYPE_CHECKING:
    from ..data.balance import Balancer


def copy_to_host(t: Tensor) -> tuple[Tensor, torch.cuda.Event | None]:
    """``t`` copied to host memory without blocking: on CUDA a pinned copy and the event recorded after it
    (read the copy once the event has completed), elsewhere a plain copy and no event."""
    cuda = t.is_cuda
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
    host.copy_(t, non_blocking=cuda)
    event = None
    if cuda:
        event = torch.cuda.Event()
        event.record()
    return host, event


class RayBudget:
    """Rays per step, adapted so a step carries about ``target`` samples through the network
    (instant-ngp's rule) and, on the fast path, its marched samples fit ``candidate_capacity``.

    Fast-path counts are device scalars: they are copied to pinned host memory without blocking
    and used once the copy has landed (a step or two later), so the host never waits for the GPU.
    """

    def __init__(
        self, n_rays: int, target: int, max_rays: int, candidate_factor: float | None = None, fill: float = 0.95
    ) -> None:
        """``candidate_factor``: marched samples per network sample that the fast renderer's buffers hold
        (``marching.candidate_factor``); None on the reference path, which has no fixed buffers.
        ``fill`` (``--sample_fill``, fast path): the ray count aims at ``fill * target`` samples; above 1
        the buffers fill up and the rays past them are left out of the loss (instant-ngp's way)."""
        self.n_rays, self.target, self.max_rays = n_rays, target, max_rays
        self.candidate_factor, self.fill = candidate_factor, fill
        # the fast renderer's buffers: samples through the network, marched samples (None: reference path)
        self.sample_capacity: int | None = None if candidate_factor is None else int(target)
        self.candidate_capacity: int | None = None if candidate_factor is None else int(candidate_factor * target)
        self.fixed: int | None = None  # set: always this many rays (--balance off)
        self._pending: list[tuple[torch.cuda.Event | None, Tensor]] = []

    def follow(self, balancer: Balancer) -> None:
        """After the balancer's update (every log interval, every rank): equal rays (``--balance off``) or
        this rank's sample target; on the fast path, buffers for the samples this rank's rays give."""
        if balancer.mode == "off":
            self.fixed = self.n_rays = balancer.equal_rays or self.n_rays
        else:
            self.target = balancer.target_samples
        if self.candidate_factor is not None:
            # equal rays (off) carry unequal samples: each rank's buffers fit what its rays give
            self.sample_capacity = balancer.sample_capacity
            self.candidate_capacity = int(self.candidate_factor * self.sample_capacity)

    def _adapt(self, samples: float, candidates: float, valid: float) -> None:
        per_ray = max(samples, 1.0) / max(valid, 1.0)
        n = self.target / per_ray
        if self.candidate_capacity:
            n = min(self.fill * n, 0.95 * self.candidate_capacity / (max(candidates, 1.0) / max(valid, 1.0)))
        step = RAY_COUNT_MULTIPLE
        self.n_rays = int(min(max(n, step), self.max_rays)) // step * step
        if self.fixed is not None:
            self.n_rays = self.fixed

    def update(self, res: StepResult, apply: bool = True) -> int:
        """Take the step's counts: applied now on the host path; on the device path copied without blocking
        and applied once landed (``apply``), or only by the next ``settle`` (``apply=False``: the ray count
        then changes only where the caller settles, as drawing rays ahead needs)."""
        if not isinstance(res.n_samples, Tensor):
            # counted on the host (the reference and model-parallel renderers): ints, exact as floats, the type
            # ``settle`` hands over too
            self._adapt(float(res.n_samples), float(res.n_candidates), float(res.n_valid))
            return self.n_rays
        counts = res.counts
        if counts is None:
            counts = torch.stack(
                [
                    torch.as_tensor(v, device=res.loss.device).float()
                    for v in (res.n_samples, res.n_candidates, res.n_valid)
                ]
            )
        host, event = copy_to_host(counts)
        self._pending.append((event, host))
        while apply and self._pending and (self._pending[0][0] is None or self._pending[0][0].query()):
            _, ready = self._pending.pop(0)
            self._adapt(*ready.tolist())
        return self.n_rays

    def settle(self) -> int:
        """Apply every pending count now (waiting for its copy). A checkpoint calls this, so the ray
        count it records is the one the next step uses, in the saved run and in the resumed one."""
        for event, ready in self._pending:
            if event is not None:
                event.synchronize()
            self._adapt(*ready.tolist())
        self._pending.clear()
        return self.n_rays
