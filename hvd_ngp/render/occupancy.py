"""Occupancy grid: which cells of the scene may hold density, so ray marching skips empty space.

instant-ngp's scheme: ``n_cascades`` nested grids of ``resolution^3`` cells around the scene centre,
cascade k covering half-extent ``h0 * 2^k``; every update decays the stored optical thickness
(``sigma * dt_min``, the finest step size, in every cascade) by ``decay`` and takes the max with
fresh density samples at jittered points of chosen cells (all cells during warm-up, then a quarter
uniformly and a quarter among occupied cells); a cell is occupied when its value exceeds
``min(threshold, mean)``, the mean taken over cascade 0.

Across ranks: the cells to refresh are drawn from a generator seeded by (seed, step) — the same
on every rank — each rank evaluates its 1/size share, and the fresh values are reduced with Max,
so every rank ends with a bit-identical grid. The grid runs no collective itself: the caller names
this rank's ``share`` and passes the Max reduction as the ``reduce_max`` callback
(``training.grid_sync``); both default to one process alone. The field is only reached through
``density_fn``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

DensityFn = Callable[[Tensor], Tensor]  # positions [M, 3] -> sigma [M]
ReduceMax = Callable[[Tensor], Tensor]  # this rank's fresh values [K * R^3] -> the elementwise max over ranks
ALONE = (0, 1)  # the share of a process that refreshes every chosen cell itself


def _alone(fresh: Tensor) -> Tensor:
    """The Max reduction of a process alone: its own values."""
    return fresh


class OccupancyGrid(nn.Module):
    """Buffers: ``density`` ``[K, R^3]`` float (optical thickness), ``occupied`` ``[K, R^3]`` bool."""

    center: Tensor  # [3]
    half0: Tensor  # [3], half-extent of cascade 0
    density: Tensor
    occupied: Tensor
    visible: Tensor  # [K, R^3] bool

    def __init__(
        self, aabb: Tensor, resolution: int = 128, n_cascades: int = 1, threshold: float = 0.01, decay: float = 0.95
    ) -> None:
        super().__init__()
        if resolution < 1 or n_cascades < 1:
            raise ValueError(
                f"occupancy grid needs resolution >= 1 and n_cascades >= 1, got {resolution}, {n_cascades}"
            )
        self.resolution, self.n_cascades = int(resolution), int(n_cascades)
        self.threshold, self.decay = float(threshold), float(decay)
        aabb = aabb.float()
        center = (aabb[0] + aabb[1]) / 2
        half = (aabb[1] - aabb[0]) / 2 / 2 ** (n_cascades - 1)  # half-extent of cascade 0
        self.register_buffer("center", center)
        self.register_buffer("half0", half)
        n = self.resolution**3
        self.register_buffer("density", torch.zeros(n_cascades, n))
        self.register_buffer("occupied", torch.ones(n_cascades, n, dtype=torch.bool))
        # cells no training camera sees: never occupied, never refreshed (instant-ngp's "untrained" cells)
        self.register_buffer("visible", torch.ones(n_cascades, n, dtype=torch.bool))

    @property
    def n_cells(self) -> int:
        return self.n_cascades * self.resolution**3

    def cascade_of(self, x: Tensor, dt: Tensor | None = None) -> Tensor:
        """Cascade used for points ``[M, 3]`` -> ``[M]`` long: the smallest that contains the point and,
        given step sizes ``dt`` ``[M]``, whose cells are at least ``dt`` wide (instant-ngp's mip rule)."""
        if self.n_cascades == 1:
            return torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        r = ((x - self.center).abs() / self.half0).amax(dim=-1)
        k = torch.ceil(torch.log2(r.clamp(min=1e-12)))
        if dt is not None:
            cell0 = 2 * self.half0.max() / self.resolution
            k = torch.maximum(k, torch.ceil(torch.log2((dt / cell0).clamp(min=1e-12))))
        return k.clamp(min=0, max=self.n_cascades - 1).long()

    def cell_index(self, x: Tensor, dt: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Flat cell index ``[M]`` and an in-bounds mask ``[M]`` for points ``[M, 3]`` (see ``cascade_of``)."""
        k = self.cascade_of(x, dt)
        extent = self.half0 * torch.pow(2.0, k.float())[:, None]
        u = (x - self.center) / (2 * extent) + 0.5
        inside = ((u >= 0) & (u <= 1)).all(dim=-1)
        R = self.resolution
        c = (u * R).long().clamp(0, R - 1)
        return k * R**3 + (c[:, 0] * R + c[:, 1]) * R + c[:, 2], inside

    def is_occupied(self, x: Tensor, dt: Tensor | None = None) -> Tensor:
        idx, inside = self.cell_index(x, dt)
        return self.occupied.view(-1)[idx] & inside

    def cell_positions(self, index: Tensor, offset: Tensor) -> Tensor:
        """World positions of cells ``[M]`` at fractional ``offset`` ``[M, 3]`` inside each cell."""
        R = self.resolution
        k, rem = index // R**3, index % R**3
        c = torch.stack([rem // (R * R), (rem // R) % R, rem % R], dim=-1).float()
        u = (c + offset) / R
        extent = self.half0 * torch.pow(2.0, k.float())[:, None]
        return self.center + (u - 0.5) * 2 * extent

    @torch.no_grad()
    def update(
        self,
        density_fn: DensityFn,
        step_size: float,
        step: int,
        warmup_steps: int,
        seed: int,
        chunk: int = 1 << 18,
        box: Tensor | None = None,
        share: tuple[int, int] = ALONE,
        reduce_max: ReduceMax = _alone,
    ) -> None:
        """Refresh the grid. ``share`` (index, count): this process's part of the chosen cells (every index
        of ``0..count-1`` must refresh its part); ``reduce_max``: the elementwise Max of the fresh values
        over those parts (with ranks: a collective, so every rank calls ``update`` at the same step).

        Stored values are optical thicknesses ``sigma * step_size`` in every cascade (instant-ngp's
        setting: the finest step size, not the larger one rays take in outer cascades, so thin density
        far out is not marked occupied 2^k times more readily), compared with ``min(threshold, mean)``.

        Data parallel: ``share`` is (rank, size). Model parallel: ``density_fn`` is this rank's region
        field, ``box`` ``[2, 3]`` its region and ``share`` its part among the region's copies, while the Max
        still runs over every rank. The rank refreshes only the chosen cells that overlap its box, at points
        clamped into the box; the Max then gives every cell the densest of its overlapping regions, so every
        rank holds the same grid (the union of the region grids, each region's cascades clipped to its box).
        """
        cells, offset = self.draw_cells(step, warmup_steps, seed)
        self.merge(self.evaluate(cells, offset, density_fn, step_size, chunk, box, share), reduce_max)

    def _seeded(self, step: int, seed: int) -> torch.Generator:
        """The update's random stream at ``step``: seeded by (seed, step), the same on every rank."""
        g = torch.Generator(device=self.density.device)
        g.manual_seed((seed * 1_000_003 + step) % (2**63))
        return g

    def draw_cells(self, step: int, warmup_steps: int, seed: int) -> tuple[Tensor, Tensor]:
        """The cells to refresh ``[M]`` long and the jittered points in them ``[M, 3]``: every cell during
        warm-up, else ``n // 4`` uniformly and ``n // 4`` among the occupied cells (``random_draws`` then
        ``pick``: the random numbers first, in one fixed order, so a graph can replay the rest)."""
        if step < warmup_steps:
            n = self.n_cells
            cells = torch.arange(n, device=self.density.device)
            return cells, torch.rand((n, 3), generator=self._seeded(step, seed), device=cells.device)
        uniform, u, offset = self.random_draws(step, seed)
        return self.pick(uniform, u), offset

    def random_draws(
        self, step: int, seed: int, out: tuple[Tensor, Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """After warm-up: ``uniform`` ``[Q]`` long cells, ``u`` ``[Q]`` float64 in [0, 1) (which occupied cell),
        ``offset`` ``[2Q, 3]`` (the points in the cells), Q = ``n // 4``; written into ``out`` when given."""
        g, dev = self._seeded(step, seed), self.density.device
        quarter = max(self.n_cells // 4, 1)
        if out is None:
            out = (
                torch.empty(quarter, dtype=torch.long, device=dev),
                torch.empty(quarter, dtype=torch.float64, device=dev),
                torch.empty((2 * quarter, 3), device=dev),
            )
        uniform, u, offset = out
        torch.randint(0, self.n_cells, (quarter,), generator=g, out=uniform)
        torch.rand(quarter, generator=g, dtype=torch.float64, out=u)
        torch.rand((2 * quarter, 3), generator=g, out=offset)
        return uniform, u, offset

    def pick(self, uniform: Tensor, u: Tensor) -> Tensor:
        """The refreshed cells ``[2Q]`` from ``random_draws``: the uniform ones, then ``u`` mapped onto the
        occupied cells (``draw_occupied``). No host read."""
        return torch.cat([uniform, self.draw_occupied(u)])

    def evaluate(
        self,
        cells: Tensor,
        offset: Tensor,
        density_fn: DensityFn,
        step_size: float,
        chunk: int = 1 << 18,
        box: Tensor | None = None,
        share: tuple[int, int] = ALONE,
    ) -> Tensor:
        """This process's fresh optical thickness ``[K * R^3]`` (0 where it evaluated nothing): its ``share``
        (index, count) of ``cells`` ``[M]`` at ``offset`` ``[M, 3]`` (see ``update`` for ``box``). No
        collective, no host read (without ``box``), so a CUDA graph can hold it."""
        index, count = share
        if box is None:
            mine, my_offset = cells[index::count], offset[index::count]
        else:
            box = box.to(cells.device)
            lo, hi = (
                self.cell_positions(cells, torch.zeros_like(offset)),
                self.cell_positions(cells, torch.ones_like(offset)),
            )
            overlaps = ((hi > box[0]) & (lo < box[1])).all(dim=-1)
            mine, my_offset = cells[overlaps][index::count], offset[overlaps][index::count]
        fresh = torch.zeros(self.n_cells, device=cells.device)
        for start in range(0, mine.numel(), chunk):
            idx = mine[start : start + chunk]
            x = self.cell_positions(idx, my_offset[start : start + chunk])
            if box is not None:
                x = torch.minimum(torch.maximum(x, box[0]), box[1])
            sigma = density_fn(x).float()
            fresh.scatter_reduce_(0, idx, sigma * step_size, reduce="amax")
        return fresh

    def merge(self, fresh: Tensor, reduce_max: ReduceMax = _alone) -> None:
        """``fresh`` ``[K * R^3]`` reduced by ``reduce_max`` (every share's values: see ``update``), then decay,
        max and the occupied bits."""
        fresh = reduce_max(fresh)
        decayed = torch.maximum(self.density * self.decay, fresh.view_as(self.density))
        self.density.copy_(torch.where(self.visible, decayed, torch.zeros_like(decayed)))
        self.refresh_occupied()

    def draw_occupied(self, u: Tensor) -> Tensor:
        """Cells drawn uniformly among the occupied ones, one per ``u`` ``[count]`` (uniform in [0, 1), float64)
        -> ``[count]`` long, without reading anything back to the host (no ``nonzero``: fixed sizes, so the
        update never waits for the GPU). With no cell occupied every draw is the last cell (refreshing it
        is harmless)."""
        seen = torch.cumsum(self.occupied.view(-1), 0)  # [n] occupied cells up to and including each
        total = seen[-1]
        r = torch.minimum((u * total).long(), (total - 1).clamp(min=0))  # the r-th occupied cell, 0-based
        return torch.searchsorted(seen, r, right=True).clamp(max=seen.numel() - 1)

    def refresh_occupied(self) -> None:
        """occupied = visible and above min(threshold, mean over cascade 0's cells) (on the device: no host
        read). As instant-ngp: the mean counts every cell of the innermost cascade, unseen ones as 0
        (their stored value), so the mostly empty outer cascades do not pull the threshold down."""
        mean = self.density[0].mean()
        self.occupied.copy_(self.visible & (self.density > mean.clamp(max=self.threshold)))

    @torch.no_grad()
    def mark_unseen(self, c2w: Tensor, intrinsics: Tensor, sizes: Tensor, near: float = 0.0) -> float:
        """Mark cells whose centre no camera sees (in front of it, inside its image) as never occupied.

        c2w ``[N, 3, 4]`` ngp convention, intrinsics ``[N, 4]``, sizes ``[N, 2]`` (width, height).
        Deterministic, so every rank computes the same mask. Returns the visible fraction.
        """
        dev = self.density.device
        cells = torch.arange(self.n_cells, device=dev)
        centres = self.cell_positions(cells, torch.full((self.n_cells, 3), 0.5, device=dev))
        seen = camera_coverage(centres, c2w, intrinsics, sizes, near) > 0
        self.visible.copy_(seen.view_as(self.visible))
        self.refresh_occupied()
        return float(seen.float().mean())

    def occupancy_fraction(self) -> float:
        return float(self.occupied.float().mean())


def camera_coverage(points: Tensor, c2w: Tensor, intrinsics: Tensor, sizes: Tensor, near: float = 0.0) -> Tensor:
    """How many cameras see each point ``[M, 3]`` (in front of the camera, inside its image) -> ``[M]`` int.

    c2w ``[N, 3, 4]`` ngp convention, intrinsics ``[N, 4]``, sizes ``[N, 2]`` (width, height)."""
    dev = points.device
    count = torch.zeros(points.shape[0], dtype=torch.int32, device=dev)
    c2w, intr, sizes = c2w.to(dev).float(), intrinsics.to(dev).float(), sizes.to(dev).float()
    for i in range(c2w.shape[0]):
        rel = (points - c2w[i, :, 3]) @ c2w[i, :, :3]  # camera coordinates (x right, y down, z fwd)
        z = rel[:, 2]
        u = intr[i, 0] * rel[:, 0] / z.clamp(min=1e-6) + intr[i, 2]
        v = intr[i, 1] * rel[:, 1] / z.clamp(min=1e-6) + intr[i, 3]
        count += ((z > near) & (u >= 0) & (u <= sizes[i, 0]) & (v >= 0) & (v <= sizes[i, 1])).int()
    return count


def n_cascades_for(aabb_scale: int) -> int:
    """instant-ngp: one cascade per doubling of the scene's extent beyond the unit cube."""
    return int(math.log2(max(1, aabb_scale))) + 1
