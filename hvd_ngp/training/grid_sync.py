"""The occupancy grid's update across ranks. ``render.occupancy`` runs no collective: here each rank's share of
the chosen cells and the Max reduction that makes every rank's grid the same (``update_grid``; the graphed
update, ``graphed.GraphedGridUpdate``, uses the same two pieces)."""

from __future__ import annotations

from torch import Tensor

from ..cluster import dist
from ..render.occupancy import DensityFn, OccupancyGrid


def rank_share() -> tuple[int, int]:
    """This rank's part of a data-parallel grid update: (rank, size)."""
    rt = dist.runtime()
    return rt.rank, rt.size


def max_over_ranks(fresh: Tensor) -> Tensor:
    """The grid's fresh values ``[K * R^3]`` reduced with Max over every rank (collective, in place)."""
    return dist.allreduce_(fresh, "max", name="occupancy.update")


def update_grid(
    grid: OccupancyGrid,
    density_fn: DensityFn,
    step_size: float,
    step: int,
    warmup_steps: int,
    seed: int,
    box: Tensor | None = None,
    share: tuple[int, int] | None = None,
) -> None:
    """``OccupancyGrid.update`` on every rank at the same step (collective): this rank's ``share`` of the cells
    (None: ``rank_share``; model parallel: its part among its region's copies, with the region's ``box``), then
    the Max over all ranks."""
    grid.update(
        density_fn, step_size, step, warmup_steps, seed, box=box, share=share or rank_share(), reduce_max=max_over_ranks
    )
