"""Single-pass inference rendering: one network pass per sample, sized by the rays still alive.

instant-ngp's inference (``NerfTracer``): per iteration every alive ray marches a few samples, ONE network
pass gives density and colour of all of them, they are composited under the transmittance each ray carries,
and the rays that turned opaque or left the box are compacted away; the alive count, not the candidates,
sizes the work. ``fast.render_rays_fast`` (the two-pass path kept beside it) runs the density network over
each window and then the whole network again over the kept samples: two hash-grid passes per kept sample.

Here, per iteration, in groups of alive rays that fill the workspace:
1. every alive ray writes its next ``width`` candidates with their positions, from the lattice step where its
   last window stopped (``march_window``: no count pass over whole rays first, which walked every ray through
   the occupied space behind its surface), into ``width`` slots of its own;
2. the written samples are packed ray after ray with their directions (``compact_triton.compact_gather``, one
   kernel, which also counts them on the device; ``density_first``: ``fast.compact`` and gathers, which also
   give each row's ray, sized by their number read on the host);
3. the whole network on them (``rgb_sigma_fn``, ``plan.rows`` at a time): on rows for every slot of the window,
   told by the device count how many are in use (``n_rows``; ``DEVICE_ROW_COUNT``), so that the host launches
   the next group's work while the device still runs this one's;
4. per ray, the prefix whose transmittance before it exceeds ``early_termination`` (the -sum(sigma dt) carried
   from the iterations before) is composited under the carried transmittance, and the ray's colour, depth,
   transmittance and -sum(sigma dt) are updated, in one kernel (``composite_into``; ``density_first``:
   ``count_until_opaque``, its colour pass, ``composite`` and torch updates); the rest of the window is the only
   evaluation wasted;
5. rays that are opaque or whose window came back short (no candidates left) drop out; ``width`` grows as rays
   die (``InferenceWindows``), so each iteration evaluates about as many samples as the first.
Host synchronisations: one per iteration (the alive rays), none per group or sample (``density_first``: one
more per group, its sample count). The samples and their compositing are the reference's
(``volume.render_rays``), so the images match it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, cast, runtime_checkable

import torch
from torch import Tensor

from ..observe.profiling import NULL_TIMER, StageTimer
from . import fast
from .compact_triton import compact_gather
from .composite_triton import composite, composite_into, count_until_opaque
from .fast import RenderWorkspace
from .march_triton import march_window
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
#: ``single_pass`` updates the rays' state in the compositing kernel (``composite_into``); False: the count,
#: ``composite`` and torch updates (``density_first``'s sequence), kept to time one against the other
FUSED_UPDATE = True
#: ``single_pass`` sizes its network calls by the window's slots and tells the network the rows in use by a device
#: count (``compact_gather``'s total: its Triton kernels skip the rest), with no host wait per group; False: the
#: host reads the count first (one wait per group, rows sized exactly), kept to time one against the other
DEVICE_ROW_COUNT = True


@dataclass
class InferenceStats:
    """Counts of single-pass renders, summed over calls: iterations, network rows (samples evaluated) and
    composited samples (device scalars, read them after the render)."""

    iterations: int = 0
    network_rows: Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.int64))
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


def rows_counted(rgb_sigma_fn: RGBSigmaFn, x: Tensor, d: Tensor, used: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """rgb ``[S, 3]`` and sigma ``[S]`` of the samples at x, along d ``[S, 3]``, of which the first ``used`` (a
    device scalar) are in use: ``rows`` at a time, each call told how many of its rows are (``n_rows``: a
    network of Triton kernels skips the rest, whose outputs no compositing reads); no host wait."""
    if x.shape[0] <= rows:  # one call: the count itself
        return rgb_sigma_fn(x, d, n_rows=used)
    return by_rows(lambda s: rgb_sigma_fn(x[s], d[s], n_rows=(used - s.start).clamp(0, rows)), x.shape[0], rows)


def density_pass(field: SplitField, x: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """sigma ``[n]`` and geo ``[n, G]`` of the samples at x ``[n, 3]``, ``rows`` at a time."""
    return by_rows(lambda s: field.query_density(x[s]), x.shape[0], rows)


def colour_of_kept(
    field: SplitField,
    x: Tensor,
    d: Tensor,
    ray: Tensor,
    geo: Tensor,
    start: Tensor,
    keep: Tensor,
    rows: int,
) -> tuple[Tensor, int]:
    """rgb ``[n, 3]`` (float32) of the packed samples at x ``[n, 3]`` along d ``[n, 3]`` (sample i of ray
    ``ray[i]``): the colour network on the samples ``composite`` reads (ray r's rows ``start[r]`` to
    ``start[r] + keep[r] - 1``), ``rows`` at a time, zeros on the others (which no pixel weighs); and how many it
    ran on (reading it is a host wait)."""
    n = x.shape[0]
    ahead = torch.arange(n, device=x.device) - start.long()[ray]  # the sample's place in its ray's window
    kept = torch.nonzero(ahead < keep.long()[ray]).squeeze(1)
    rgb = torch.zeros(n, 3, device=x.device, dtype=torch.float32)
    for a in range(0, kept.numel(), rows):
        sel = kept[a : a + rows]
        rgb[sel] = field.colour(x[sel], d[sel], geo[sel]).float()
    return rgb, kept.numel()


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
    if workspace is None:
        n = max(R * windows.first, windows.most)
        workspace = RenderWorkspace(RenderPlan(max(R, 1), n, n), dev)
    plan = workspace.plan
    slots = min(plan.candidates, max(plan.rows, windows.most))  # candidates written at once (the workspace's)
    rgb = torch.zeros(R, 3, device=dev)
    depth, transmittance = torch.zeros(R, device=dev), torch.ones(R, device=dev)
    log_t = torch.zeros(R, device=dev)  # -sum(sigma dt) over each ray's composited samples
    resume = torch.zeros(R, device=dev, dtype=torch.int32)  # each ray's lattice step where its next window starts
    alive = torch.arange(R, device=dev)  # a ray without candidates ends in its first window
    width, log_eps = windows.first, math.log(early_termination) if early_termination > 0 else -math.inf
    while alive.numel():
        short = torch.zeros(alive.numel(), device=dev, dtype=torch.bool)  # the window ran out of candidates
        per_group = max(slots // width, 1)
        for a in range(0, alive.numel(), per_group):
            ids = alive[a : a + per_group]
            o, d = origins[ids], directions[ids]
            steps = resume[ids]  # a copy: the march moves it on, then it goes back
            jit = None if jitter is None else jitter[ids]
            win = march_window(o, d, aabb, grid, schedule, jit, steps, width, launch, workspace.buffers[:2])
            resume[ids] = steps
            short[a : a + per_group] = win.count < width
            timer.mark("march")
            base = torch.arange(ids.numel(), device=dev, dtype=torch.int32) * width
            if colour_after_density:  # its colour pass needs each row's ray: torch packing, sized on the host
                rows_used = n = int(win.count.sum())  # a host wait
                timer.mark("host waits")
                if n == 0:
                    continue
                src, ray, start, count, _ = fast.compact(win.count, base, n)
                start, count = start.int(), count.int()
                x, t, dt, dr = win.x[src], win.t[src], win.dt[src], d[ray]
            else:  # the packing and the four gathers in one kernel (about twenty torch kernels otherwise)
                if DEVICE_ROW_COUNT:  # a row for every slot; the rows in use counted on the device
                    capacity = ids.numel() * width
                else:
                    capacity = int(win.count.sum())  # a host wait
                    timer.mark("host waits")
                    if capacity == 0:
                        continue
                t, dt, x, dr, start, count, _, rows_used = compact_gather(
                    win.count, base, win.t, win.dt, win.x, o, d, capacity
                )
            timer.mark("compaction")
            if colour_after_density:
                sigma, geo = density_pass(cast(SplitField, rgb_sigma_fn), x, plan.rows)
            else:
                c, sigma = rows_counted(rgb_sigma_fn, x, dr, rows_used, plan.rows)
            timer.mark("network")
            if colour_after_density or not FUSED_UPDATE:  # density_first: the count first, then colour the kept
                carried = log_t[ids].contiguous()
                keep = count_until_opaque(sigma, dt, start, count, early_termination, carried)
                log_t[ids] = carried
                timer.mark("composite")
                if colour_after_density:
                    c, coloured = colour_of_kept(
                        cast(SplitField, rgb_sigma_fn), x, dr, ray, geo, start, keep, plan.rows
                    )
                    timer.mark("network")
                    if stats is not None:
                        stats.colour_rows += coloured
                w_rgb, w_opacity, w_depth = composite(sigma, c, dt, t, start, keep)
                before = transmittance[ids]
                rgb[ids] += before[:, None] * w_rgb
                depth[ids] += before * w_depth
                transmittance[ids] = before * (1.0 - w_opacity)
            else:  # the count, the compositing and the rays' state in one kernel
                keep = composite_into(
                    sigma, c, dt, t, start, count, ids, early_termination, log_t, transmittance, rgb, depth
                )
            timer.mark("composite")
            if stats is not None:
                stats.network_rows = stats.network_rows.to(dev) + rows_used
                stats.composited = stats.composited.to(dev) + keep.sum()
        if stats is not None:
            stats.iterations += 1
        still = ~short & (log_t[alive] > log_eps)
        timer.mark("compaction")
        alive = alive[still]  # reads the count back: a host wait
        timer.mark("host waits")
        width = windows.next_width(R, alive.numel())
    return rgb, 1.0 - transmittance, depth


def render_rays_density_first(*args, **kwargs) -> tuple[Tensor, Tensor, Tensor]:
    """``render_rays_single_pass`` with ``colour_after_density``: the colour network only on composited samples
    (the ``density_first`` inference path)."""
    return render_rays_single_pass(*args, **{**kwargs, "colour_after_density": True})
