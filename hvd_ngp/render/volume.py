"""Ray marching through the occupancy grid and volume rendering of packed samples.

The sample spacing along a ray is ``schedule.StepSchedule``.

Layout: a batch of R rays is marched into a dense lane of S candidate steps per ray; candidates
in free cells are dropped, and the survivors are *packed* (ray-major, so each ray's samples are
contiguous and in order). Transmittance is computed by a cumulative sum along the dense lane,
which is exact per ray.

Training renders in two passes, like instant-ngp: densities of all packed samples without
gradients give the transmittance, samples behind an opaque surface (T < ``early_termination``)
are dropped, and only the survivors go through the network with gradients. The packing is the
one host synchronisation of a step (the number of samples must be known to size the tensors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .. import faultpoints
from ..observe.memory import DEFAULT_ROW_BYTES, MemoryBudget
from ..observe.profiling import NULL_TIMER, StageTimer
from ..triton_support import inference_math, inference_math_now
from .geometry import intersect_aabb
from .occupancy import OccupancyGrid
from .plan import plan_render, reference_chunk
from .schedule import StepSchedule

RGBSigmaFn = Callable[..., tuple[Tensor, Tensor]]  # x [M,3], d [M,3] -> rgb [M,3], sigma [M]; n_rows as SigmaFn
SigmaFn = Callable[..., Tensor]  # x [M,3] -> sigma [M]; the fast renderer adds n_rows=count (rows >= count unused)


@dataclass
class Samples:
    """Packed samples of R rays. mask ``[R, S]`` marks the dense-lane slots that hold a sample;
    ray ``[M]``, t ``[M]`` (midpoint), dt ``[M]`` follow the mask's row-major order."""

    mask: Tensor
    ray: Tensor
    t: Tensor
    dt: Tensor

    def __len__(self) -> int:
        return int(self.ray.shape[0])

    def select(self, keep: Tensor) -> "Samples":
        """The samples where ``keep`` ``[M]`` is true (mask updated accordingly)."""
        mask = self.mask.clone()
        mask[self.mask] = keep
        return Samples(mask, self.ray[keep], self.t[keep], self.dt[keep])

    def positions(self, origins: Tensor, directions: Tensor) -> Tensor:
        return origins[self.ray] + directions[self.ray] * self.t[:, None]


def march(
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid | None,
    schedule: StepSchedule,
    jitter: Tensor | None = None,
) -> Samples:
    """Candidate samples at ``T(F(t_near) + k + jitter)`` inside the aabb and in occupied cells.

    origins, directions ``[R, 3]`` (unit); jitter ``[R]`` in [0, 1) or None (0.5: midpoints).
    Reference implementation: one host sync to size the dense lanes.
    """
    R = origins.shape[0]
    t_near, t_far = intersect_aabb(origins, directions, aabb)
    t_near = t_near.clamp(min=schedule.near)
    hit = t_far > t_near
    s_near = schedule.coord(t_near)
    span = torch.where(hit, schedule.coord(t_far) - s_near, torch.zeros_like(s_near))
    n_steps = min(int(span.max().ceil()) + 1 if R else 1, schedule.max_steps)
    j = jitter if jitter is not None else torch.full((R,), 0.5, device=origins.device)
    k = torch.arange(n_steps, device=origins.device, dtype=origins.dtype)
    s = s_near[:, None] + k[None, :] + j[:, None]  # [R, S]
    t = schedule.time(s)
    dt = schedule.time(s + 1.0) - t
    valid = (t < t_far[:, None]) & hit[:, None]
    if grid is not None:
        x = origins[:, None, :] + directions[:, None, :] * t[..., None]
        valid = valid & grid.is_occupied(x.view(-1, 3), dt.reshape(-1)).view(R, n_steps)
    ray = torch.arange(R, device=origins.device)[:, None].expand(R, n_steps)[valid]
    return Samples(valid, ray, t[valid], dt[valid])


def transmittance_weights(sigma: Tensor, samples: Samples) -> tuple[Tensor, Tensor]:
    """Volume-rendering weights and the transmittance before each sample, both ``[M]``.

    w_i = T_i (1 - exp(-sigma_i dt_i)), T_i = exp(-sum_{j<i} sigma_j dt_j) along each ray.
    """
    tau = torch.zeros(samples.mask.shape, dtype=sigma.dtype, device=sigma.device)
    tau = tau.masked_scatter(samples.mask, sigma * samples.dt)
    cum = torch.cumsum(tau, dim=1)
    t_before = torch.exp(-(cum - tau))
    w = t_before * (1.0 - torch.exp(-tau))
    return w[samples.mask], t_before[samples.mask]


def accumulate(weights: Tensor, values: Tensor | None, ray: Tensor, n_rays: int) -> Tensor:
    """Per-ray sums: weights ``[M]`` times values ``[M, C]`` (or 1) -> ``[R, C]`` (or ``[R]``)."""
    if values is None:
        return torch.zeros(n_rays, dtype=weights.dtype, device=weights.device).index_add(0, ray, weights)
    out = torch.zeros(n_rays, values.shape[-1], dtype=values.dtype, device=values.device)
    return out.index_add(0, ray, weights[:, None] * values)


@dataclass
class RenderResult:
    """rgb ``[R, 3]`` (premultiplied: no background), opacity ``[R]``, depth ``[R]``; n_samples: the
    samples that went through the full network, n_candidates: the samples marched; normal ``[R, 3]``: the
    weighted sum of the samples' outward unit normals (``density_normals``), when asked for."""

    rgb: Tensor
    opacity: Tensor
    depth: Tensor
    n_samples: int
    n_candidates: int
    normal: Tensor | None = None


def density_normals(sigma_fn: SigmaFn, x: Tensor, step: float) -> Tensor:
    """Outward unit normals ``-grad sigma / |grad sigma|`` at x ``[M, 3]`` -> ``[M, 3]``, the gradient by central
    differences ``step`` apart (six density queries per point, no autograd: every encoding backend can); zero
    where the density is flat."""
    offsets = torch.eye(3, dtype=x.dtype, device=x.device) * step
    sigma = sigma_fn(torch.cat([x + offsets[i] for i in range(3)] + [x - offsets[i] for i in range(3)]))
    sigma = sigma.float().view(6, -1)
    n = (sigma[3:] - sigma[:3]).T  # -gradient * 2 step
    return n / n.norm(dim=-1, keepdim=True).clamp(min=1e-20)


def drop_occluded(
    samples: Samples, origins: Tensor, directions: Tensor, sigma_fn: SigmaFn, early_termination: float
) -> Samples:
    """The density pass: densities of every sample without gradients, and the samples kept where the
    transmittance before them is still above ``early_termination`` (all of them when it is 0)."""
    if early_termination <= 0 or not len(samples):
        return samples
    with torch.no_grad():
        sigma0 = sigma_fn(samples.positions(origins, directions))
        _, t_before = transmittance_weights(sigma0, samples)
    return samples.select(t_before > early_termination)


def render_rays(
    rgb_sigma_fn: RGBSigmaFn,
    sigma_fn: SigmaFn,
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid | None,
    schedule: StepSchedule,
    early_termination: float = 1e-4,
    jitter: Tensor | None = None,
    timer: StageTimer = NULL_TIMER,
    normal_step: float = 0.0,
) -> RenderResult:
    """Two-pass rendering of R rays (see the module docstring). Differentiable in the second pass.
    ``normal_step`` > 0: also the composited normals (``RenderResult.normal``; no gradient)."""
    R = origins.shape[0]
    samples = march(origins, directions, aabb, grid, schedule, jitter)
    timer.mark("march")
    n_candidates = len(samples)
    samples = drop_occluded(samples, origins, directions, sigma_fn, early_termination)
    timer.mark("density pass")
    x = samples.positions(origins, directions)
    rgb, sigma = rgb_sigma_fn(x, directions[samples.ray])
    timer.mark("network fwd")
    w, _ = transmittance_weights(sigma, samples)
    out = RenderResult(
        accumulate(w, rgb, samples.ray, R),
        accumulate(w, None, samples.ray, R),
        accumulate(w, samples.t[:, None], samples.ray, R)[:, 0],
        len(samples),
        n_candidates,
    )
    if normal_step > 0:
        with torch.no_grad():
            out.normal = accumulate(w.detach(), density_normals(sigma_fn, x.detach(), normal_step), samples.ray, R)
    timer.mark("composite")
    return out


def render_image(
    rgb_sigma_fn: RGBSigmaFn,
    sigma_fn: SigmaFn,
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid | None,
    schedule: StepSchedule,
    background: Tensor,
    early_termination: float = 1e-4,
    fast: bool = False,
    budget: MemoryBudget | None = None,
    workspace=None,
    row_bytes: int | None = None,
    step_offset: float = 0.5,
    between_chunks: Callable[[], None] | None = None,
    inference: str = "two_pass",  # DEFAULT_INFERENCE
) -> tuple[Tensor, Tensor]:
    """Render rays in chunks without gradients: rgb on ``background`` ``[3]`` -> ``[R, 3]``, depth ``[R]``.

    ``fast``: the Triton kernels (``render.fast``) instead of the reference. Chunks are planned from
    ``budget`` (None: the default sizes; ``render.plan``): the fast path takes a ``workspace``
    (``render.fast.RenderWorkspace``, reused across calls) or plans one here; ``row_bytes``: measured
    bytes per network row (see ``observe.memory.bytes_per_row``); ``step_offset`` in [0, 1): where samples sit
    inside their steps (the ``jitter`` of every ray); ``between_chunks``: see ``render_in_chunks``; ``inference``: the
    fast path's renderer, one of ``INFERENCE_PATHS`` (``single_pass``: ``render.infer``; ``two_pass``:
    ``render.fast.render_rays_fast``)."""
    available = budget.available() if budget is not None else None
    if fast:
        from .fast import RenderWorkspace, inference_costs

        render_fast = inference_path(inference)
        if workspace is None:
            costs = inference_costs(schedule, row_bytes or DEFAULT_ROW_BYTES)
            workspace = RenderWorkspace(plan_render(available, costs, max_lanes(schedule, aabb)), origins.device)
        chunk = workspace.plan.rays
    else:
        chunk = reference_chunk(available, max_lanes(schedule, aabb), row_bytes or DEFAULT_ROW_BYTES)

    def render(o: Tensor, d: Tensor, j: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        if fast:
            return render_fast(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, schedule, early_termination, workspace, j)
        out = render_rays(rgb_sigma_fn, sigma_fn, o, d, aabb, grid, schedule, early_termination, j)
        return out.rgb, out.opacity, out.depth

    return render_in_chunks(render, origins, directions, background, chunk, step_offset, between_chunks)


#: the fast path's inference renderers (``render_image(inference=...)``, the render tool's ``--inference``);
#: ``density_first`` is ``single_pass`` with the colour network on the composited samples only (not yet timed on a GPU)
INFERENCE_PATHS = ("single_pass", "two_pass", "density_first")
#: the default: ``single_pass``, with march segments of 1024 steps (``fast.INFERENCE_LAUNCH``): on an H100
#: (2026-12-07, one process, warm kernels) lego 800x800 0.0295 s per view against ``two_pass``'s 0.032, fox
#: 1080x1920 0.27 against 0.34, at the same PSNR (docs/inference.md)
DEFAULT_INFERENCE = "single_pass"


#: the fused kernels' math in inference outside autocast (``triton_support.inference_math``): "fp16", half products
#: with fp32 sums and the hash grid gathering from a half copy of its table. On an H100 (2026-12-07, 60 s snapshots,
#: single_pass, one process): lego20 0.0308 -> 0.0275 s per view, PSNR 36.132 -> 36.128 dB; fox 0.2217 -> 0.1717 s,
#: 28.479 -> 28.476 dB, against "tf32" (docs/inference.md). Training's own passes are not affected.
INFERENCE_MATH = "fp16"


def inference_scope():
    """The context every inference render runs its field in: ``triton_support.inference_math`` of the math an outer
    ``inference_math`` context chose (the render tool's ``--inference_math``), else ``INFERENCE_MATH``."""
    return inference_math(inference_math_now() or INFERENCE_MATH)


def inference_path(name: str) -> Callable[..., tuple[Tensor, Tensor, Tensor]]:
    """The inference renderer called ``name`` (one of ``INFERENCE_PATHS``), with ``render_rays_fast``'s
    interface; ValueError for another name."""
    if name == "single_pass":
        from .infer import render_rays_single_pass

        return render_rays_single_pass
    if name == "two_pass":
        from .fast import render_rays_fast

        return render_rays_fast
    if name == "density_first":  # single_pass with the colour network on composited samples only
        from .infer import render_rays_density_first

        return render_rays_density_first
    raise ValueError(f"unknown inference path {name!r} (known: {', '.join(INFERENCE_PATHS)})")


def render_in_chunks(
    render: Callable[[Tensor, Tensor, Tensor | None], tuple[Tensor, Tensor, Tensor]],
    origins: Tensor,
    directions: Tensor,
    background: Tensor,
    chunk: int,
    step_offset: float = 0.5,
    between_chunks: Callable[[], None] | None = None,
) -> tuple[Tensor, Tensor]:
    """Rays ``[R, 3]`` rendered ``chunk`` at a time without gradients by ``render(o, d, jitter)`` -> (rgb
    ``[r, 3]``, opacity ``[r]``, depth ``[r]``): rgb on ``background`` ``[R, 3]``, depth ``[R]``. ``jitter`` is
    None at ``step_offset`` 0.5 (the renderers' default), else ``step_offset`` for every ray.
    ``between_chunks()`` runs before each chunk: the caller's way to cut the render short by raising (the
    evaluation passes ``cluster.preempt.interruption_point``: a stop request needs no finished view)."""
    rgbs, depths = [], []
    with torch.no_grad(), inference_scope():
        for s in range(0, origins.shape[0], chunk):
            faultpoints.render_chunk()  # test hook (HVD_NGP_FAULTS): slow work before the check; a no-op otherwise
            if between_chunks is not None:
                between_chunks()
            o, d = origins[s : s + chunk], directions[s : s + chunk]
            j = None if step_offset == 0.5 else torch.full((o.shape[0],), step_offset, device=o.device)
            rgb, opacity, depth = render(o, d, j)
            rgbs.append(over_background(rgb, opacity, background))
            depths.append(depth)
    return torch.cat(rgbs), torch.cat(depths)


def over_background(rgb: Tensor, opacity: Tensor, background: Tensor) -> Tensor:
    """Rendered (premultiplied) ``rgb`` ``[R, 3]`` of ``opacity`` ``[R]`` over ``background`` ``[R, 3]`` or ``[3]``
    -> ``[R, 3]`` in fp32."""
    return rgb.float() + background * (1.0 - opacity.float()[:, None])


def composite_background(rgba: Tensor, background: Tensor) -> Tensor:
    """Straight (not premultiplied) RGBA ``[R, 4]``, such as a training image's pixels, over ``background``
    ``[R, 3]`` or ``[3]`` -> RGB ``[R, 3]`` in rgba's dtype: the targets that ``over_background``'s renders
    are compared with."""
    return rgba[:, :3] * rgba[:, 3:4] + background * (1.0 - rgba[:, 3:4])


def max_lanes(schedule: StepSchedule, aabb: Tensor) -> int:
    """The most steps a ray can take through ``aabb`` (its diagonal, from the near distance), capped
    by ``schedule.max_steps``: the worst case of a ray's dense lanes and candidates."""
    diagonal = float((aabb[1] - aabb[0]).norm())
    t = torch.tensor([schedule.near, schedule.near + diagonal], dtype=torch.float64)
    span = schedule.coord(t)
    return int(min(schedule.max_steps, math.ceil(float(span[1] - span[0])) + 2))
