"""Space split into axis-aligned regions, ray segments through one region, and their front-to-back merge.

NeRF-XL's decomposition (Li et al., NVIDIA 2024): the scene's box is cut into K boxes; the samples of
a ray that fall in box k form its segment k, rendered by the owner of box k alone to premultiplied
colour ``C_k``, opacity ``A_k``, depth ``D_k`` (weights of the segment's own transmittance) and
optical thickness ``tau_k`` (``T_k = exp(-tau_k)``). Because the boxes are convex and disjoint, the
segments are disjoint intervals of the ray, and sorting them by entry distance gives

    C = sum_k T_<k C_k,  A = sum_k T_<k A_k,  D = sum_k T_<k D_k,  T_<k = exp(-sum_{j<k} tau_j),

which is the single-field volume-rendering sum regrouped (``merge``).

Samples sit where the whole-scene march puts them (``volume.march``: the same step schedule from
the scene box's entry), and each is given to the box that contains its position (``Partition.owner``),
so the K segments hold exactly the whole ray's samples. Early termination acts within a segment
(its own transmittance), as in NeRF-XL; with ``early_termination = 0`` the merge equals the
single-field render up to float rounding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, cast

import torch
from torch import Tensor

from ..errors import ConfigError
from ..observe.profiling import NULL_TIMER, StageTimer
from .geometry import intersect_aabb
from .occupancy import OccupancyGrid
from .schedule import StepSchedule
from .volume import RGBSigmaFn, Samples, SigmaFn, accumulate, drop_occluded, transmittance_weights

#: columns of a rendered segment ``[R, SEGMENT_COLUMNS]``: rgb (3), opacity, depth, tau
SEGMENT_COLUMNS = 6


@dataclass(frozen=True)
class Partition:
    """K axis-aligned boxes ``boxes`` ``[K, 2, 3]`` that tile ``aabb`` ``[2, 3]`` (recursive bisection)."""

    aabb: Tensor
    boxes: Tensor

    @property
    def k(self) -> int:
        return int(self.boxes.shape[0])

    def to(self, device: torch.device) -> "Partition":
        return Partition(self.aabb.to(device), self.boxes.to(device))

    def to_json(self) -> str:
        return json.dumps({"aabb": self.aabb.tolist(), "boxes": self.boxes.tolist()})

    @staticmethod
    def from_json(text: str) -> "Partition":
        d = json.loads(text)
        return Partition(torch.tensor(d["aabb"], dtype=torch.float32), torch.tensor(d["boxes"], dtype=torch.float32))

    def owner(self, x: Tensor) -> Tensor:
        """Region of each point ``[M, 3]`` -> ``[M]`` long: the box with ``lo <= x < hi``, its faces on the
        scene box's surface extended to infinity, so every point has exactly one owner."""
        lo, hi = self.boxes[:, 0].to(x.device), self.boxes[:, 1].to(x.device)  # [K, 3]
        outer_lo = lo <= self.aabb[0].to(x.device)
        outer_hi = hi >= self.aabb[1].to(x.device)
        inside = ((x[:, None, :] >= lo) | outer_lo) & ((x[:, None, :] < hi) | outer_hi)  # [M, K, 3]
        return inside.all(dim=-1).to(torch.int64).argmax(dim=1)

    def entry_order(self, origins: Tensor, directions: Tensor) -> Tensor:
        """Regions in the order each ray ``[R, 3]`` enters them -> ``[R, K]`` (missed boxes last)."""
        t_in = torch.stack([_entry(origins, directions, self.boxes[k].to(origins.device)) for k in range(self.k)], 1)
        return torch.argsort(t_in, dim=1, stable=True)

    def describe(self) -> str:
        return "; ".join(
            f"region {k}: " + " x ".join(f"[{a:.3f}, {b:.3f}]" for a, b in zip(box[0].tolist(), box[1].tolist()))
            for k, box in enumerate(self.boxes)
        )


def _entry(origins: Tensor, directions: Tensor, box: Tensor) -> Tensor:
    t_in, t_out = intersect_aabb(origins, directions, box)
    return torch.where(t_out > t_in, t_in, torch.full_like(t_in, float("inf")))


def split_space(aabb: Tensor, k: int, work: Tensor, cells: int, source: str = "--model_parallel") -> Partition:
    """``aabb`` cut into ``k`` boxes of about equal expected ``work`` ``[cells, cells, cells]`` (a per-cell
    weight over a ``cells^3`` lattice of the box, e.g. the cells a training camera sees): recursive
    bisection of the longest side, each cut on a lattice plane at the weighted quantile that gives
    the two halves work in proportion to the regions they will hold (the nearest plane). Deterministic."""
    if k < 1:
        raise ConfigError(f"{source}: the number of regions must be >= 1, got {k}")
    aabb = aabb.float().cpu()
    work = work.float().cpu().clamp(min=0) + 1e-6  # empty space still costs a little (rays cross it)
    boxes: list[tuple[list[int], list[int]]] = []

    def cut(lo: list[int], hi: list[int], parts: int) -> None:
        if parts == 1:
            boxes.append((lo, hi))
            return
        sizes = [(hi[a] - lo[a]) * float(aabb[1, a] - aabb[0, a]) for a in range(3)]
        axis = max(range(3), key=lambda a: (sizes[a], -a))
        n = hi[axis] - lo[axis]
        if n < parts:
            raise ConfigError(
                f"{source}: {k} regions are more than the occupancy grid allows: a box of {n} cell(s) "
                f"along axis {'xyz'[axis]} cannot be cut into {parts} (raise marching.grid_resolution "
                f"or lower --model_parallel)"
            )
        left = parts // 2
        block = work[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
        profile = block.sum(dim=tuple(a for a in range(3) if a != axis))
        cum = torch.cumsum(profile, 0) / profile.sum()
        want = left / parts
        c = int((cum - want).abs().argmin().item()) + 1  # cells on the left: the lattice plane nearest the quantile
        c = max(left, min(n - (parts - left), c))  # every part keeps a cell per region it holds
        mid = lo[axis] + c
        cut(lo, [mid if a == axis else hi[a] for a in range(3)], left)
        cut([mid if a == axis else lo[a] for a in range(3)], hi, parts - left)

    cut([0, 0, 0], [cells] * 3, k)
    size = (aabb[1] - aabb[0]) / cells
    out = torch.stack(
        [
            torch.stack(
                [
                    aabb[0] + torch.tensor(lo, dtype=torch.float32) * size,
                    aabb[0] + torch.tensor(hi, dtype=torch.float32) * size,
                ]
            )
            for lo, hi in boxes
        ]
    )
    out[:, 1] = torch.where(torch.tensor([[hi[a] == cells for a in range(3)] for _, hi in boxes]), aabb[1], out[:, 1])
    return Partition(aabb, out)


def march_segment(
    origins: Tensor,
    directions: Tensor,
    partition: Partition,
    region: int,
    grid: OccupancyGrid | None,
    schedule: StepSchedule,
    jitter: Tensor | None = None,
) -> Samples:
    """The samples of ``volume.march`` over the whole scene box that lie in box ``region`` (the dense lane
    spans only that box's interval of each ray, so a segment costs its own length)."""
    R = origins.shape[0]
    aabb = partition.aabb.to(origins.device)
    t_near, t_far = intersect_aabb(origins, directions, aabb)
    t_near = t_near.clamp(min=schedule.near)
    hit = t_far > t_near
    t_in, t_out = intersect_aabb(origins, directions, partition.boxes[region].to(origins.device))
    t_in, t_out = torch.maximum(t_in, t_near), torch.minimum(t_out, t_far)
    hit = hit & (t_out > t_in)
    j = jitter if jitter is not None else torch.full((R,), 0.5, device=origins.device)
    s_near = schedule.coord(t_near)
    zero = torch.zeros_like(s_near)
    first = torch.where(hit, torch.floor(schedule.coord(t_in) - s_near - j) - 1, zero).clamp(min=0)  # [R]
    last = torch.where(hit, torch.ceil(schedule.coord(t_out) - s_near - j) + 1, zero)
    n_steps = int((last - first).max().item()) + 1 if R else 1
    n_steps = max(1, min(n_steps, schedule.max_steps))
    k = first[:, None] + torch.arange(n_steps, device=origins.device, dtype=origins.dtype)[None, :]  # global index
    s = s_near[:, None] + k + j[:, None]
    t = schedule.time(s)
    dt = schedule.time(s + 1.0) - t
    valid = (t < t_far[:, None]) & hit[:, None] & (k < schedule.max_steps)
    x = origins[:, None, :] + directions[:, None, :] * t[..., None]
    valid = valid & (partition.owner(x.view(-1, 3)) == region).view(R, n_steps)
    if grid is not None:
        valid = valid & grid.is_occupied(x.view(-1, 3), dt.reshape(-1)).view(R, n_steps)
    ray = torch.arange(R, device=origins.device)[:, None].expand(R, n_steps)[valid]
    return Samples(valid, ray, t[valid], dt[valid])


@dataclass
class Segment:
    """One region's part of R rays: ``values`` ``[R, SEGMENT_COLUMNS]`` (rgb premultiplied by the segment's
    own transmittance, opacity, depth, tau = the segment's optical thickness), sample counts."""

    values: Tensor
    n_samples: int
    n_candidates: int


def render_segment(
    rgb_sigma_fn: RGBSigmaFn,
    sigma_fn: SigmaFn,
    origins: Tensor,
    directions: Tensor,
    partition: Partition,
    region: int,
    grid: OccupancyGrid | None,
    schedule: StepSchedule,
    early_termination: float = 1e-4,
    jitter: Tensor | None = None,
    timer: StageTimer = NULL_TIMER,
) -> Segment:
    """``volume.render_rays`` restricted to box ``region`` (two passes; differentiable in the second)."""
    R = origins.shape[0]
    samples = march_segment(origins, directions, partition, region, grid, schedule, jitter)
    timer.mark("march")
    n_candidates = len(samples)
    samples = drop_occluded(samples, origins, directions, sigma_fn, early_termination)
    timer.mark("density pass")
    rgb, sigma = rgb_sigma_fn(samples.positions(origins, directions), directions[samples.ray])
    timer.mark("network fwd")
    w, _ = transmittance_weights(sigma, samples)
    sigma = sigma.float()
    values = torch.cat(
        [
            accumulate(w, rgb.float(), samples.ray, R),
            accumulate(w, None, samples.ray, R)[:, None],
            accumulate(w, samples.t[:, None], samples.ray, R),
            accumulate(sigma * samples.dt, None, samples.ray, R)[:, None],
        ],
        dim=1,
    )
    timer.mark("composite")
    return Segment(values, len(samples), n_candidates)


def merge(parts: Tensor, order: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Segments ``[K, R, SEGMENT_COLUMNS]`` and each ray's entry order ``[R, K]`` -> rgb ``[R, 3]``,
    opacity ``[R]``, depth ``[R]`` of the whole rays (front to back, see the module docstring)."""
    K, R, C = parts.shape
    rays = torch.arange(R, device=parts.device)[:, None].expand(R, K)
    ordered = parts[order, rays]  # [R, K, C], front to back
    tau = ordered[..., 5]
    before = torch.cat([torch.zeros_like(tau[:, :1]), torch.cumsum(tau, dim=1)[:, :-1]], dim=1)
    t_before = torch.exp(-before)  # [R, K]
    total = (t_before[..., None] * ordered[..., :5]).sum(dim=1)
    return total[:, :3], total[:, 3], total[:, 4]


class RegionField(Protocol):
    """What ``PiecewiseField`` calls on each region's field (``model.field.NGPField``)."""

    def query_density(self, x: Tensor, n_rows: Tensor | None = None) -> tuple[Tensor, Tensor]: ...

    def __call__(self, x: Tensor, d: Tensor) -> tuple[Tensor, Tensor]: ...

    def colour(self, x: Tensor, d: Tensor, geo: Tensor) -> Tensor: ...


class PiecewiseField(torch.nn.Module):
    """K region fields (each over its box of ``partition``) as one field over the scene box: every point
    goes to its owner's field (``Partition.owner``). The render tool renders a model-parallel snapshot
    on one rank with it; with ``early_termination = 0`` its render equals the merged segments.

    query_density: x ``[M, 3]`` -> (sigma ``[M]``, geo_feat ``[M, G]``); forward: x, d -> (rgb ``[M, 3]``, sigma ``[M]``)
    """

    aabb: Tensor  # [2, 3] buffer: the partition's box

    def __init__(self, fields: Sequence[torch.nn.Module], partition: Partition) -> None:
        super().__init__()
        if len(fields) != partition.k:
            raise ValueError(f"{len(fields)} fields for {partition.k} regions")
        self.fields = torch.nn.ModuleList(fields)
        self.partition = partition
        self.register_buffer("aabb", partition.aabb.float().clone())

    def _dispatch(self, x: Tensor, call: Callable[[RegionField, Tensor], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
        """``call(field, rows)`` for each region's field on the rows of x ``[M, 3]`` it owns -> its outputs, each
        joined to ``[M, ...]`` (every row from its owner's field)."""
        owner = self.partition.owner(x)
        outs: list[tuple[Tensor, tuple[Tensor, ...]]] = []  # per region: its rows of x, its field's outputs
        for k, f in enumerate(self.fields):
            sel = (owner == k).nonzero().squeeze(1)
            # a region's field is an NGPField (render may not import model: RegionField names what is used of
            # it); ModuleList hands its items back as plain Modules
            outs.append((sel, call(cast(RegionField, f), sel)))
        first = next(out for _, out in outs)
        joined = [u.new_zeros((x.shape[0], *u.shape[1:])) for u in first]
        for sel, values in outs:
            joined = [a.index_copy(0, sel, u.to(a.dtype)) for a, u in zip(joined, values)]
        return tuple(joined)

    def query_density(self, x: Tensor, n_rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The region fields' density and features of ``x`` ``[M, 3]``; ``n_rows`` (the fast renderer's used
        rows, here and in ``forward``) is accepted as the field's callbacks take it, and ignored: every row is
        computed."""
        sigma, geo = self._dispatch(x, lambda f, sel: f.query_density(x[sel]))
        return sigma, geo

    def density(self, x: Tensor, n_rows: Tensor | None = None) -> Tensor:
        """sigma ``[M]`` alone (the renderers' density callback)."""
        return self.query_density(x)[0]

    def forward(self, x: Tensor, d: Tensor, n_rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        rgb, sigma = self._dispatch(x, lambda f, sel: f(x[sel], d[sel]))
        return rgb, sigma

    def colour(self, x: Tensor, d: Tensor, geo: Tensor) -> Tensor:
        """rgb ``[M, 3]`` of each point's owner's colour network from its ``query_density`` features ``geo``."""
        (rgb,) = self._dispatch(x, lambda f, sel: (f.colour(x[sel], d[sel], geo[sel]).float(),))
        return rgb
