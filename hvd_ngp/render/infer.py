"""Single-pass inference rendering: one network pass per sample, sized by the rays still alive.

instant-ngp's inference (``NerfTracer``): per iteration every alive ray marches a few samples, ONE network
pass gives density and colour of all of them, they are composited under the transmittance each ray carries,
and the rays that turned opaque or left the box are compacted away; the alive count, not the candidates,
sizes the work. ``fast.render_rays_fast`` (the two-pass path kept beside it) runs the density network over
each window and then the whole network again over the kept samples: two hash-grid passes per kept sample.

Here, per iteration:
1. every alive ray's next ``width`` candidates are written with their positions (``march_write`` in window
   mode; the march's count pass ran once per chunk);
2. the whole network on them (``rgb_sigma_fn``, ``plan.rows`` at a time);
3. per ray, the prefix whose transmittance before it exceeds ``early_termination`` (``count_until_opaque``,
   the -sum(sigma dt) carried from the iterations before) is composited (``composite`` reads just that prefix)
   under the carried transmittance; the rest of the window is the only evaluation wasted;
4. rays that are opaque or have no candidates left drop out; ``width`` grows as rays die
   (``InferenceWindows``), so each iteration evaluates about as many samples as the first.
Host synchronisations: two per iteration (the window's sample count, the alive rays), none per sample.
The samples and their compositing are the reference's (``volume.render_rays``), so the images match it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, cast, runtime_checkable

import torch
from torch import Tensor

from ..observe.profiling import NULL_TIMER, StageTimer
from . import fast
from .composite_triton import composite, count_until_opaque
from .fast import RenderWorkspace, candidate_windows, window_groups
from .march_triton import march_counts, march_write, window_start
from .occupancy import OccupancyGrid
from .plan import RenderPlan
from .schedule import StepSchedule

if TYPE_CHECKING:  # volume imports this module lazily: no import back at run time
    from .volume import RGBSigmaFn, SigmaFn


@dataclass(frozen=True)
class InferenceWindows:
    """Candidates each alive ray marches per iteration: ``first`` in the first iteration, then
    ``clamp(first * rays // alive, first, most)``: as rays die the survivors march further, and each
    iteration evaluates about ``first * rays`` samples (instant-ngp's steps between compactions)."""

    first: int = 8
    most: int = 128

    def __post_init__(self) -> None:
        if not 1 <= self.first <= self.most:
            raise ValueError(f"inference windows need 1 <= first <= most, got {self.first}, {self.most}")

    def next_width(self, rays: int, alive: int) -> int:
        return max(self.first, min(self.most, self.first * rays // max(alive, 1)))

    @staticmethod
    def parse(text: str) -> InferenceWindows:
        """``"FIRST:MOST"`` (e.g. ``"8:128"``) -> InferenceWindows; ValueError naming the text otherwise."""
        try:
            first, most = (int(v) for v in text.split(":"))
        except ValueError:
            raise ValueError(f"inference windows {text!r}: expected FIRST:MOST, e.g. 8:128") from None
        return InferenceWindows(first, most)


#: the windows inference renders with unless told otherwise
WINDOWS = InferenceWindows()


@dataclass
class InferenceStats:
    """Counts of single-pass renders, summed over calls: iterations, network rows (samples evaluated) and
    composited samples (device scalar, read it after the render)."""

    iterations: int = 0
    network_rows: int = 0
    composited: Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.int64))
    colour_rows: int = 0  # ``density_first``: samples the colour network ran on (the others: ``network_rows``)


@runtime_checkable
class SplitField(Protocol):
    """A field whose colour can be asked for after its density (``model.field.NGPField``,
    ``render.regions.PiecewiseField``): ``query_density(x [n, 3])`` -> (sigma ``[n]``, geo ``[n, G]``);
    ``colour(x [m, 3], d [m, 3], geo [m, G])`` -> rgb ``[m, 3]`` in [0, 1]."""

    def query_density(self, x: Tensor, n_rows: Tensor | None = None) -> tuple[Tensor, Tensor]: ...

    def colour(self, x: Tensor, d: Tensor, geo: Tensor) -> Tensor: ...


def by_rows(call: Callable[[slice], tuple[Tensor, Tensor]], n: int, rows: int) -> tuple[Tensor, Tensor]:
    """``call(rows_slice)`` -> two tensors over those rows, for n rows ``rows`` at a time, joined."""
    if n <= rows:
        return call(slice(0, n))
    out = [call(slice(a, a + rows)) for a in range(0, n, rows)]
    return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])


def density_pass(field: SplitField, x: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """sigma ``[n]`` and geo ``[n, G]`` of the samples at x ``[n, 3]``, ``rows`` at a time."""
    return by_rows(lambda s: field.query_density(x[s]), x.shape[0], rows)


def colour_of_kept(
    field: SplitField,
    x: Tensor,
    directions: Tensor,
    ray: Tensor,
    geo: Tensor,
    start: Tensor,
    keep: Tensor,
    rows: int,
) -> tuple[Tensor, int]:
    """rgb ``[n, 3]`` (float32) of the packed samples at x ``[n, 3]`` along ``directions[ray]``: the colour network
    on the samples ``composite`` reads (ray r's rows ``start[r]`` to ``start[r] + keep[r] - 1``), ``rows`` at a
    time, zeros on the others (which no pixel weighs); and how many it ran on (reading it is a host wait)."""
    n = x.shape[0]
    ahead = torch.arange(n, device=x.device) - start.long()[ray]  # the sample's place in its ray's window
    kept = torch.nonzero(ahead < keep.long()[ray]).squeeze(1)
    rgb = torch.zeros(n, 3, device=x.device, dtype=torch.float32)
    for a in range(0, kept.numel(), rows):
        sel = kept[a : a + rows]
        rgb[sel] = field.colour(x[sel], directions[ray[sel]], geo[sel]).float()
    return rgb, kept.numel()


def network_pass(
    rgb_sigma_fn: RGBSigmaFn, x: Tensor, directions: Tensor, ray: Tensor, rows: int
) -> tuple[Tensor, Tensor]:
    """rgb ``[n, 3]`` and sigma ``[n]`` of the samples at x ``[n, 3]`` along ``directions[ray]`` (``[A, 3]``,
    ``[n]``), ``rows`` at a time."""
    return by_rows(lambda s: rgb_sigma_fn(x[s], directions[ray[s]]), x.shape[0], rows)


def render_rays_single_pass(
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
    windows: InferenceWindows | None = None,
    timer: StageTimer = NULL_TIMER,
    stats: InferenceStats | None = None,
    colour_after_density: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Inference (see the module docstring): rgb ``[R, 3]`` (no background), opacity ``[R]``, depth ``[R]``;
    ``jitter`` ``[R]`` as in training (None: 0.5). ``render_rays_fast``'s interface (``sigma_fn`` unused);
    the workspace's plan bounds the candidates written at once and the rows per network call (None: one
    sized for these rays). ``timer``: stage marks (march, network, composite, compaction, host waits).
    ``colour_after_density`` (the ``density_first`` path): per window the density network on every candidate,
    then the colour network on the composited ones only (``rgb_sigma_fn`` a ``SplitField``; one more host wait
    per window group, for the composited samples' rows)."""
    if colour_after_density and not isinstance(rgb_sigma_fn, SplitField):
        raise ValueError("the density_first inference path needs a field with query_density and colour")
    R = origins.shape[0]
    dev = origins.device
    windows = windows or WINDOWS
    launch = fast.INFERENCE_LAUNCH
    seg_count = march_counts(origins, directions, aabb, grid, schedule, jitter, launch)
    total = seg_count.sum(1, dtype=torch.int32)
    timer.mark("march")
    if workspace is None:
        n = max(int(total.sum()) if R else 0, 1)
        workspace = RenderWorkspace(RenderPlan(R, n, n), dev)
    plan = workspace.plan
    rgb = torch.zeros(R, 3, device=dev)
    depth, transmittance = torch.zeros(R, device=dev), torch.ones(R, device=dev)
    log_t = torch.zeros(R, device=dev)  # -sum(sigma dt) over each ray's composited samples
    done = torch.zeros(R, device=dev, dtype=torch.int32)  # candidates marched so far, per ray
    resume = window_start(R, schedule, launch, dev)  # each segment's lattice step where its next window starts
    alive = torch.nonzero(total > 0).squeeze(1)
    timer.mark("host waits")
    width, log_eps = windows.first, math.log(early_termination) if early_termination > 0 else -math.inf
    while alive.numel():
        marched = done[alive]
        skip, take = candidate_windows(seg_count[alive], marched, marched + width)
        ends = torch.cumsum(take.sum(1, dtype=torch.int64), 0)
        timer.mark("compaction")
        groups = window_groups(ends, plan.candidates, width)
        timer.mark("host waits")
        for a, b, n in groups:
            if n == 0:
                continue
            ids = alive[a:b]
            steps = resume[ids]  # a copy: the march moves it on, then it goes back
            d = directions[ids]
            packed = march_write(
                origins[ids],
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
            timer.mark("march")
            assert packed.x is not None  # positions=True: the march wrote each sample's point
            ray = packed.ray.long()
            if colour_after_density:
                sigma, geo = density_pass(cast(SplitField, rgb_sigma_fn), packed.x, plan.rows)
            else:
                c, sigma = network_pass(rgb_sigma_fn, packed.x, d, ray, plan.rows)
            timer.mark("network")
            carried = log_t[ids].contiguous()
            keep = count_until_opaque(sigma, packed.dt, packed.start, packed.count, early_termination, carried)
            log_t[ids] = carried
            if colour_after_density:
                timer.mark("composite")
                c, coloured = colour_of_kept(
                    cast(SplitField, rgb_sigma_fn), packed.x, d, ray, geo, packed.start, keep, plan.rows
                )
                timer.mark("network")
                if stats is not None:
                    stats.colour_rows += coloured
            w_rgb, w_opacity, w_depth = composite(sigma, c, packed.dt, packed.t, packed.start, keep)
            before = transmittance[ids]
            rgb[ids] += before[:, None] * w_rgb
            depth[ids] += before * w_depth
            transmittance[ids] = before * (1.0 - w_opacity)
            timer.mark("composite")
            if stats is not None:
                stats.network_rows += n
                stats.composited = stats.composited.to(dev) + keep.sum()
        if stats is not None:
            stats.iterations += 1
        done[alive] = marched + width
        still = (marched + width < total[alive]) & (log_t[alive] > log_eps)
        timer.mark("compaction")
        alive = alive[still]  # reads the count back: a host wait
        timer.mark("host waits")
        width = windows.next_width(R, alive.numel())
    return rgb, 1.0 - transmittance, depth


def render_rays_density_first(*args, **kwargs) -> tuple[Tensor, Tensor, Tensor]:
    """``render_rays_single_pass`` with ``colour_after_density``: the colour network only on composited samples
    (the ``density_first`` inference path)."""
    return render_rays_single_pass(*args, **{**kwargs, "colour_after_density": True})
