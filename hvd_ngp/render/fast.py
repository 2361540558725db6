"""The fast GPU renderer: fixed-size buffers, Triton kernels, no host synchronisation.

Per training step (instant-ngp's scheme):
1. march the rays into at most ``candidate_capacity`` packed samples (``march_triton``);
2. densities of the filled candidate slots without gradients (``sigma_fn(x, n_rows=packed.total)``:
   the grid stays sized for ``candidate_capacity``, the Triton kernels skip the slots past the device
   count); per ray, keep the samples in front of the point where transmittance drops below
   ``early_termination`` (``composite_triton``, which reads each ray's filled slots only);
3. compact the kept samples into exactly ``sample_capacity`` rows (rays that do not fit are
   marked invalid and left out of the loss), one kernel that finds each row's ray by binary search instead
   of a host-side count (``compact_triton``; twin ``compact_gather_torch``), gathering the rows' positions
   as the march wrote them;
4. the network with gradients on those rows (``rgb_sigma_fn(x, d, n_rows=total)``: the Triton kernels skip the
   rows past the kept samples, which would otherwise pile the hash grid's backward atomics onto one point),
   and differentiable compositing (``composite_triton``).
Every tensor has a size known before the step starts, so the host never waits for the device;
sample counts come back as device scalars that the trainer reads asynchronously.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from ..observe.profiling import NULL_TIMER, StageTimer
from .compact_triton import compact_gather
from .composite_triton import composite, count_until_opaque
from .march_triton import march_counts, march_packed, march_write, segments, window_start
from .occupancy import OccupancyGrid
from .plan import RenderCosts, RenderPlan, split_by_capacity
from .schedule import MarchLaunch, StepSchedule

if TYPE_CHECKING:  # volume imports this module lazily (its fast path): no import back at run time
    from .volume import RGBSigmaFn, SigmaFn


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


def compact_gather_torch(
    keep: Tensor, start: Tensor, t: Tensor, dt: Tensor, x: Tensor, origins: Tensor, directions: Tensor, capacity: int
) -> tuple[Tensor, ...]:
    """The network's ``capacity`` rows from the marched samples (twin of ``compact_triton.compact_gather``):
    keep, start ``[R]``; t, dt ``[C]``, x ``[C, 3]``; origins, directions ``[R, 3]`` -> (t, dt ``[S]``, x, d
    ``[S, 3]``, start, count ``[R]`` int32, fits ``[R]`` bool, total ``[]`` int64: the rows used). Unused rows
    (``>= total``): t = dt = 0 at the last ray's origin."""
    R = keep.shape[0]
    src, ray, new_start, count, fits = compact(keep, start, capacity)
    used = ray < R
    ray_c = ray.clamp(max=R - 1)
    return (
        torch.where(used, t[src], 0.0),
        torch.where(used, dt[src], 0.0),
        torch.where(used[:, None], x[src], origins[ray_c]),
        directions[ray_c],
        new_start.int(),
        count.int(),
        fits,
        count.sum(),
    )


class Capacities(Protocol):
    """Buffer sizes of the fast renderer: marched samples and samples through the network per call."""

    candidate_capacity: int
    sample_capacity: int


@dataclass
class FixedCapacities:
    candidate_capacity: int
    sample_capacity: int


class FastRenderer:
    """Training-time renderer with fixed buffers: ``candidate_capacity`` marched samples and
    ``sample_capacity`` samples through the network with gradients. ``sigma_fn`` is called as
    ``sigma_fn(x, n_rows=count)`` and ``rgb_sigma_fn`` as ``rgb_sigma_fn(x, d, n_rows=count)``: only the first
    ``count`` (a device scalar) rows are read back, and the rest get no gradient.

    ``FastRenderer(c, s)`` keeps fixed sizes; ``FastRenderer.following(budget)`` reads them at every
    call from ``budget`` (the trainer's ``training.budget.RayBudget``, the one owner of those numbers).
    ``launch``: how the march kernel runs (None: ``march_triton.LAUNCH``)."""

    def __init__(self, candidate_capacity: int, sample_capacity: int, launch: MarchLaunch | None = None) -> None:
        self.capacities: Capacities = FixedCapacities(int(candidate_capacity), int(sample_capacity))
        self.launch = launch

    @staticmethod
    def following(capacities: Capacities, launch: MarchLaunch | None = None) -> "FastRenderer":
        renderer = FastRenderer(0, 0, launch)
        renderer.capacities = capacities
        return renderer

    @property
    def candidate_capacity(self) -> int:
        return int(self.capacities.candidate_capacity)

    @property
    def sample_capacity(self) -> int:
        return int(self.capacities.sample_capacity)

    def __call__(
        self,
        rgb_sigma_fn: RGBSigmaFn,
        sigma_fn: SigmaFn,
        origins: Tensor,
        directions: Tensor,
        aabb: Tensor,
        grid: OccupancyGrid,
        schedule: StepSchedule,
        early_termination: float,
        jitter: Tensor | None,
        timer: StageTimer = NULL_TIMER,
    ) -> FastRenderResult:
        packed = march_packed(
            origins,
            directions,
            aabb,
            grid,
            schedule,
            jitter,
            self.candidate_capacity,
            positions=True,
            launch=self.launch,
        )
        timer.mark("march")
        assert packed.x is not None  # positions=True: the march wrote each sample's point
        with torch.no_grad():  # the march wrote the positions: slots >= total are unwritten, and not read below
            sigma0 = sigma_fn(packed.x, n_rows=packed.total)
            keep = count_until_opaque(sigma0, packed.dt, packed.start, packed.count, early_termination)
        timer.mark("density pass")
        # unused rows sit at the last ray's origin with t = dt = 0 (finite network inputs: a NaN there would reach
        # the weight gradients through 0 * NaN), outside every ray's compositing
        t, dt, x, d, start, count, fits, total = compact_gather(
            keep, packed.start, packed.t, packed.dt, packed.x, origins, directions, self.sample_capacity
        )
        timer.mark("compaction")
        rgb, sigma = rgb_sigma_fn(x, d, n_rows=total)  # the Triton kernels skip the unused rows
        timer.mark("network fwd")
        out_rgb, opacity, depth = composite(sigma, rgb, dt, t, start, count)
        timer.mark("composite")
        return FastRenderResult(out_rgb, opacity, depth, packed.fits & fits, packed.total, total)


#: bytes one item of an inference render holds (``render.plan.RenderCosts``): per ray, the count pass's
#: per-segment int32 counts, int64 ends and int32 starts plus rays and results; per candidate slot,
#: t, dt, ray and its density (16), the compaction's int64 plans (48) and the kept t, dt (8), rounded up
CANDIDATE_BYTES = 96


def inference_costs(schedule: StepSchedule, row_bytes: int) -> RenderCosts:
    """Bytes per ray (its outputs and carried state; its segments' counts, windows and slots), per candidate
    slot and per network row of ``render_rays_fast``."""
    return RenderCosts(128 + 48 * segments(schedule, INFERENCE_LAUNCH), CANDIDATE_BYTES, row_bytes)


def batched(fn, n: int, rows: int, make_inputs) -> list:
    """``fn(*make_inputs(a, b))`` over row ranges of at most ``rows``; the outputs, in order."""
    return [fn(*make_inputs(a, min(a + rows, n))) for a in range(0, n, rows)]


class RenderWorkspace:
    """The marching workspace of an inference render: t, dt, ray buffers of ``plan.candidates`` slots,
    allocated once and reused by every chunk and view."""

    def __init__(self, plan: RenderPlan, device: torch.device) -> None:
        self.plan = plan
        self.buffers = (
            torch.empty(plan.candidates, device=device),
            torch.empty(plan.candidates, device=device),
            torch.empty(plan.candidates, device=device, dtype=torch.int32),
        )


#: how inference renders launch the march kernel (two_pass's count and write passes; single_pass's count-free
#: windows take its block and warps, one program per whole ray): one program walks 1024
#: lattice steps of 32 rays, where training's ``LAUNCH`` splits each ray into 32-step programs. An inference chunk
#: has rays enough to fill the GPU without splitting them, and in a window most of a ray's short segments would
#: be idle programs. H100, 2026-12-07, warm kernels: lego 0.042 -> 0.032 s per view (``two_pass``), fox 0.48 ->
#: 0.34; ``benchmarks/inference_sweep.py`` (docs/inference.md)
INFERENCE_LAUNCH = MarchLaunch(segment=1024)

#: candidates per ray in an inference render's first window; each next window is WINDOW_GROWTH times the last
#: (lego, H100, 2026-12-07: 32 then doubling 0.043 s per view, 16 then doubling 0.046; docs/inference.md)
FIRST_WINDOW = 32
WINDOW_GROWTH = 2


def segment_starts(seg_count: Tensor) -> Tensor:
    """Each segment's first candidate within its ray: the exclusive running total along dim 1 of ``seg_count``
    ``[A, S]`` int32 -> ``[A, S]`` int32. One flat scan over all A * S counts, less each row's total before it,
    instead of torch's scan along the inner dimension (its kernel for short rows was 0.56 ms per window of an
    800x800 view on an H100, 2026-12-07)."""
    if seg_count.numel() == 0:
        return seg_count.to(torch.int32)
    flat = torch.cumsum(seg_count.reshape(-1), 0, dtype=torch.int64).view(seg_count.shape)
    exclusive = flat - seg_count
    return (exclusive - exclusive[:, :1]).to(torch.int32)


def candidate_windows(seg_count: Tensor, lo: Tensor, hi: Tensor) -> tuple[Tensor, Tensor]:
    """Each ray's candidates ``[lo, hi)`` (``[A]`` each, in marching order) by segment: (skip, take) ``[A, S]``
    int32, how many of each segment's ``seg_count`` ``[A, S]`` candidates come before the window and how many
    are in it."""
    first = segment_starts(seg_count)
    lo, hi = lo[:, None].to(torch.int32), hi[:, None].to(torch.int32)
    take = (torch.minimum(hi, first + seg_count) - torch.maximum(lo, first)).clamp(min=0)
    skip = (lo - first).clamp(min=0).minimum(seg_count)
    return skip.to(torch.int32).contiguous(), take.to(torch.int32).contiguous()


def window_groups(ends: Tensor, capacity: int, width: int) -> list[tuple[int, int, int]]:
    """Ray ranges ``[a, b)`` with their candidate count n, each n <= ``capacity``; ``ends`` ``[A]`` int64: the
    running total of the rays' window candidates, each ray at most ``width``. One small read from the device:
    the total, then (when it does not fit) the boundaries at multiples of ``capacity - width``."""
    total = int(ends[-1])
    if total <= capacity:
        return [(0, ends.shape[0], total)]
    step = capacity - min(width, capacity)
    if step < capacity // 2:  # windows as large as the workspace: the greedy split on the host
        host = ends.tolist()
        return [(a, b, host[b - 1] - (host[a - 1] if a else 0)) for a, b in split_by_capacity(host, capacity)]
    marks = torch.arange(step, total, step, device=ends.device, dtype=ends.dtype)
    cuts = torch.searchsorted(ends, marks, right=True)  # rays whose running total is <= each mark
    bounds = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), ends.shape[0])])
    sums = torch.cat([ends.new_zeros(1), ends])[bounds]
    b_host, s_host = bounds.tolist(), sums.tolist()
    return [(a, b, s_host[k + 1] - s_host[k]) for k, (a, b) in enumerate(itertools.pairwise(b_host)) if b > a]


def render_rays_fast(
    rgb_sigma_fn: RGBSigmaFn,
    sigma_fn: SigmaFn,
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid,
    schedule: StepSchedule,
    early_termination: float = 1e-4,
    workspace: RenderWorkspace | None = None,
    jitter: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Inference with the Triton kernels within a plan (``render.plan.plan_render``): rgb ``[R, 3]`` (no
    background), opacity ``[R]``, depth ``[R]``; ``jitter`` ``[R]`` as in training (None: 0.5).

    Rays march in windows of their candidates (``FIRST_WINDOW``, then twice as many each time, as
    instant-ngp's inference marches a few steps at a time): a window's densities decide where each ray turns
    opaque (its -sum(sigma dt) carried over from the windows before), and only rays still transparent with
    candidates left march the next window, so the samples behind a surface are never evaluated. Per
    window, the count pass's totals size groups of rays that fill the workspace; the network runs on the
    filled candidate slots only, ``plan.rows`` at a time. Without a ``workspace``, one sized for these rays.
    The samples and their compositing are the reference's: each window's colour is added under the
    transmittance left by the windows before.
    """
    R = origins.shape[0]
    dev = origins.device
    launch = INFERENCE_LAUNCH
    seg_count = march_counts(origins, directions, aabb, grid, schedule, jitter, launch)
    total = seg_count.sum(1, dtype=torch.int32)
    if workspace is None:
        n = max(int(total.sum()) if R else 0, 1)
        workspace = RenderWorkspace(RenderPlan(R, n, n), dev)
    rows = workspace.plan.rows
    rgb = torch.zeros(R, 3, device=dev)
    depth, transmittance = torch.zeros(R, device=dev), torch.ones(R, device=dev)
    log_t = torch.zeros(R, device=dev)  # -sum(sigma dt) of the density pass over each ray's kept samples
    done = torch.zeros(R, device=dev, dtype=torch.int32)  # candidates marched so far, per ray
    resume = window_start(R, schedule, launch, dev)  # each segment's lattice step where its next window starts
    alive = torch.nonzero(total > 0).squeeze(1)
    width, log_eps = FIRST_WINDOW, math.log(early_termination) if early_termination > 0 else -math.inf
    while alive.numel():
        marched = done[alive]
        skip, take = candidate_windows(seg_count[alive], marched, marched + width)
        ends = torch.cumsum(take.sum(1, dtype=torch.int64), 0)
        for a, b, n in window_groups(ends, workspace.plan.candidates, width):
            if n == 0:
                continue
            ids = alive[a:b]
            steps = resume[ids]  # a copy: the march moves it on, then it goes back
            o, d = origins[ids], directions[ids]
            packed = march_write(
                o,
                d,
                aabb,
                grid,
                schedule,
                None if jitter is None else jitter[ids],
                take[a:b],
                n,
                workspace.buffers,
                positions=True,
                launch=launch,
                skip=skip[a:b],
                resume=steps,
            )
            resume[ids] = steps
            assert packed.x is not None  # positions=True: the march wrote each sample's point

            def points(i: int, j: int, x: Tensor = packed.x) -> tuple[Tensor]:
                return (x[i:j],)

            sigma0 = torch.cat(batched(sigma_fn, n, rows, points))
            carried = log_t[ids].contiguous()
            keep = count_until_opaque(sigma0, packed.dt, packed.start, packed.count, early_termination, carried)
            log_t[ids] = carried
            src, kept_ray, start, count, _ = compact(keep, packed.start, int(keep.sum()))
            t, dt = packed.t[src], packed.dt[src]
            kept_ray = kept_ray.clamp(max=b - a - 1)

            def points_dirs(i: int, j: int) -> tuple[Tensor, Tensor]:
                dirs = d[kept_ray[i:j]]
                return o[kept_ray[i:j]] + dirs * t[i:j, None], dirs

            out = batched(rgb_sigma_fn, t.shape[0], rows, points_dirs)
            if not out:
                continue
            c, sig = torch.cat([x[0] for x in out]), torch.cat([x[1] for x in out])
            w_rgb, w_opacity, w_depth = composite(sig, c, dt, t, start.int(), count.int())
            before = transmittance[ids]
            rgb[ids] += before[:, None] * w_rgb.float()
            depth[ids] += before * w_depth.float()
            transmittance[ids] = before * (1.0 - w_opacity.float())
        done[alive] = marched + width
        alive = alive[(marched + width < total[alive]) & (log_t[alive] > log_eps)]
        width *= WINDOW_GROWTH
    return rgb, 1.0 - transmittance, depth
