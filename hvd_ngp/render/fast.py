"""The fast GPU renderer: fixed-size buffers, Triton kernels, no host synchronisation.

Per training step (instant-ngp's scheme):
1. march the rays into at most ``candidate_capacity`` packed samples (``kernels.march``);
2. densities of all candidates without gradients; per ray, keep the samples in front of the
   point where transmittance drops below ``early_termination`` (``kernels.composite``);
3. compact the kept samples into exactly ``sample_capacity`` rows (rays that do not fit are
   marked invalid and left out of the loss), with ``searchsorted`` instead of a host-side count;
4. the network with gradients on those rows, and differentiable compositing (``kernels.composite``).
Every tensor has a size known before the step starts, so the host never waits for the device;
sample counts come back as device scalars that the trainer reads asynchronously.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..kernels.composite import composite, count_until_opaque
from ..kernels.march import march_packed
from ..occupancy import OccupancyGrid
from ..profiling import NULL_TIMER, StageTimer
from . import RGBSigmaFn, SigmaFn, StepSchedule


@dataclass
class FastRenderResult:
    """rgb ``[R, 3]`` (no background), opacity, depth ``[R]``; valid ``[R]`` bool (rays that fit in the
    buffers); n_candidates, n_samples: device scalars (marched samples, samples through the network)."""

    rgb: Tensor
    opacity: Tensor
    depth: Tensor
    valid: Tensor
    n_candidates: Tensor
    n_samples: Tensor


def compact(keep: Tensor, start: Tensor, capacity: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Plan ``capacity`` rows holding the first ``keep[r]`` samples of each ray that fits.

    keep, start ``[R]`` -> (source sample index ``[G]``, ray ``[G]`` (R for padding), new start ``[R]``,
    new count ``[R]``, fits ``[R]``).
    """
    R = keep.shape[0]
    keep = keep.long()
    ends = torch.cumsum(keep, 0)
    new_start = ends - keep
    fits = ends <= capacity
    count = torch.where(fits, keep, torch.zeros_like(keep))
    slot = torch.arange(capacity, device=keep.device)
    ray = torch.searchsorted(ends, slot, right=True)
    ray_c = ray.clamp(max=max(R - 1, 0))
    j = slot - new_start[ray_c]
    used = (ray < R) & (j < count[ray_c])
    src = torch.where(used, start[ray_c].long() + j, torch.zeros_like(j))
    return src, torch.where(used, ray, torch.full_like(ray, R)), new_start, count, fits


class FastRenderer:
    """Training-time renderer with fixed buffers: ``candidate_capacity`` marched samples and
    ``sample_capacity`` samples through the network with gradients."""

    def __init__(self, candidate_capacity: int, sample_capacity: int) -> None:
        self.candidate_capacity = int(candidate_capacity)
        self.sample_capacity = int(sample_capacity)

    def __call__(self, rgb_sigma_fn: RGBSigmaFn, sigma_fn: SigmaFn, origins: Tensor, directions: Tensor,
                 aabb: Tensor, grid: OccupancyGrid, schedule: StepSchedule, early_termination: float,
                 jitter: Tensor | None, timer: StageTimer = NULL_TIMER) -> FastRenderResult:
        R = origins.shape[0]
        packed = march_packed(origins, directions, aabb, grid, schedule, jitter, self.candidate_capacity)
        timer.mark("march")
        ray_c = packed.ray.long().clamp(max=R - 1)
        with torch.no_grad():
            x = origins[ray_c] + directions[ray_c] * packed.t[:, None]
            sigma0 = sigma_fn(x)
            keep = count_until_opaque(sigma0, packed.dt, packed.start, packed.count, early_termination)
        timer.mark("density pass")
        src, ray, start, count, fits = compact(keep, packed.start, self.sample_capacity)
        ray_c = ray.clamp(max=R - 1)
        t, dt = packed.t[src], packed.dt[src]
        d = directions[ray_c]
        x = origins[ray_c] + d * t[:, None]
        timer.mark("compaction")
        rgb, sigma = rgb_sigma_fn(x, d)
        timer.mark("network fwd")
        out_rgb, opacity, depth = composite(sigma, rgb, dt, t, start.int(), count.int())
        timer.mark("composite")
        return FastRenderResult(out_rgb, opacity, depth, packed.fits & fits, packed.total, count.sum())


def render_rays_fast(rgb_sigma_fn: RGBSigmaFn, sigma_fn: SigmaFn, origins: Tensor, directions: Tensor, aabb: Tensor,
                     grid: OccupancyGrid, schedule: StepSchedule, early_termination: float = 1e-4,
                     jitter: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Inference with the Triton kernels and exactly sized buffers (two host synchronisations):
    rgb ``[R, 3]`` (no background), opacity ``[R]``, depth ``[R]``; ``jitter`` ``[R]`` as in training (None: 0.5)."""
    R = origins.shape[0]
    packed = march_packed(origins, directions, aabb, grid, schedule, jitter, None)
    ray_c = packed.ray.long().clamp(max=max(R - 1, 0))
    x = origins[ray_c] + directions[ray_c] * packed.t[:, None]
    keep = count_until_opaque(sigma_fn(x), packed.dt, packed.start, packed.count, early_termination)
    src, ray, start, count, _ = compact(keep, packed.start, int(keep.sum()))
    ray_c = ray.clamp(max=max(R - 1, 0))
    t, dt = packed.t[src], packed.dt[src]
    d = directions[ray_c]
    rgb, sigma = rgb_sigma_fn(origins[ray_c] + d * t[:, None], d)
    return composite(sigma, rgb, dt, t, start.int(), count.int())
