"""Hybrid data x model parallelism (``--model_parallel K``): the hash grid split by space across ranks.

N ranks form D = N / K replicas x K regions (``cluster.dist.Groups``; rank = replica * K + region).
The scene box is cut once into K boxes of about equal expected work (``render.regions.split_space``
weighted by camera coverage: how many training cameras see each cell), agreed from rank 0 and recorded in checkpoints. Each rank
holds one region's field (hash grid of 2^(log2_hashmap_size - ceil(log2 K)) entries per level, so the
K regions together hold the configured table, and its own MLPs); every rank keeps the same
occupancy grid, each region refreshing the cells that overlap its box.

One training step of a replica: its K ranks draw the same rays (samplers and background streams
seeded by the replica index), each renders its segment of every ray (``render.regions``), the
segments ``[R, 6]`` are allgathered in the replica group (``dist.replica_allgather``, whose backward
hands each rank the gradient of its own slice), merged front to back, and every rank of the replica
takes the same loss on the merged colour. Each region's gradients are averaged over its D copies
(the region group's process set). Communication per step grows with the rays (24 bytes per ray and
region), not with the model.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..cluster import dist
from ..errors import ConfigError
from ..model.field import NGPField
from ..observe.metrics import COL
from ..observe.profiling import NULL_TIMER, StageTimer
from ..render.occupancy import OccupancyGrid, camera_coverage
from ..render.regions import SEGMENT_COLUMNS, Partition, merge, render_segment, split_space
from ..render.schedule import StepSchedule
from ..render.volume import RenderResult, render_in_chunks

EXCHANGE_NAME = "model_parallel.segments"


def region_model(model: dict, k: int) -> dict:
    """The model config of one of ``k`` regions: the hash table split over the regions (each level
    ``2^(log2_hashmap_size - ceil(log2 k))`` entries); the rest as configured. Identity at k = 1."""
    if k <= 1:
        return model
    source = model.get("_source", "config")
    log2 = int(model["encoding"].get("log2_hashmap_size", 19))
    per_region = log2 - math.ceil(math.log2(k))
    if per_region < 1:
        raise ConfigError(
            f"{source}: --model_parallel {k} is more regions than encoding.log2_hashmap_size {log2} "
            f"can be split into (each region would hold 2^{per_region} entries per level)"
        )
    out = copy.deepcopy(model)
    out["encoding"]["log2_hashmap_size"] = per_region
    return out


def plan_partition(
    frames, aabb: Tensor, k: int, cells: int, near: float = 0.0, source: str = "--model_parallel"
) -> Partition:
    """Rank 0 cuts the box by camera coverage (how many training cameras see each cell of a ``cells^3``
    lattice over ``aabb``: the rays, and so the samples, a region will carry); every rank receives rank
    0's partition (collective). ``frames``: the training ``Frames`` (c2w, intrinsics, sizes)."""

    def decide() -> str:
        u = (torch.arange(cells, dtype=torch.float32) + 0.5) / cells
        lattice = torch.stack(torch.meshgrid(u, u, u, indexing="ij"), dim=-1).view(-1, 3)
        lo, hi = aabb[0].float().cpu(), aabb[1].float().cpu()
        work = camera_coverage(lo + lattice * (hi - lo), frames.c2w, frames.intrinsics, frames.sizes, near)
        return split_space(aabb, k, work.float().view(cells, cells, cells), cells, source).to_json()

    text = dist.agree(lambda: decide() if dist.runtime().is_root else None, "splitting the scene into regions")
    text = dist.broadcast_object(text, name="model_parallel.partition")
    assert text is not None, "every rank holds rank 0's partition after the broadcast, and rank 0 decided one"
    return Partition.from_json(text)


def hash_parameters(field: NGPField) -> int:
    return sum(p.numel() for p in field.encoding_parameters())


@dataclass
class ExchangeStats:
    """What the segment exchange cost this rank since the last ``take``."""

    bytes: int = 0
    seconds: float = 0.0

    def take(self) -> "ExchangeStats":
        out = ExchangeStats(self.bytes, self.seconds)
        self.bytes, self.seconds = 0, 0.0
        return out


class ModelParallel:
    """This rank's part of a K-region layout: its region box, the renderer that exchanges segments
    (a drop-in for ``render.render_rays`` in ``training.step.train_step``), evaluation shares, and the
    per-interval report."""

    def __init__(self, groups: dist.Groups, partition: Partition) -> None:
        if partition.k != groups.model_parallel:
            raise ConfigError(
                f"the partition has {partition.k} regions but --model_parallel is {groups.model_parallel}"
            )
        self.groups, self.partition = groups, partition
        self.region = groups.region
        self.box = partition.boxes[self.region]
        self.stats = ExchangeStats()
        self.step_samples: list[int] = []  # per render call of the current step: the replica's largest count

    # -------------------------------------------------------------------------------- rendering

    def __call__(
        self,
        rgb_sigma_fn,
        sigma_fn,
        origins: Tensor,
        directions: Tensor,
        aabb: Tensor,
        grid: OccupancyGrid | None,
        schedule: StepSchedule,
        early_termination: float = 1e-4,
        jitter: Tensor | None = None,
        timer: StageTimer = NULL_TIMER,
    ) -> RenderResult:
        """Render this rank's segment of the replica's rays ``[R, 3]``, exchange, merge (differentiable):
        rgb ``[R, 3]``, opacity ``[R]``, depth ``[R]`` of the whole rays; the counts are this rank's.
        ``aabb`` (the region field's box) is not used: the partition holds the scene box."""
        device = origins.device
        partition = self.partition if self.partition.aabb.device == device else self.partition.to(device)
        self.partition = partition
        seg = render_segment(
            rgb_sigma_fn,
            sigma_fn,
            origins,
            directions,
            partition,
            self.region,
            grid,
            schedule,
            early_termination,
            jitter,
            timer,
        )
        R = origins.shape[0]
        meta = torch.zeros(1, SEGMENT_COLUMNS, device=device)
        meta[0, 0], meta[0, 1] = float(seg.n_samples), float(seg.n_candidates)  # exact below 2^24
        local = torch.cat([seg.values, meta])
        start = time.perf_counter()
        gathered = dist.replica_allgather(local, name=EXCHANGE_NAME)
        self.stats.seconds += time.perf_counter() - start
        self.stats.bytes += gathered.numel() * gathered.element_size()
        parts = gathered.view(self.groups.model_parallel, R + 1, SEGMENT_COLUMNS)
        self.step_samples.append(int(parts[:, R, 0].max().item()))
        timer.mark("exchange")
        rgb, opacity, depth = merge(parts[:, :R], partition.entry_order(origins, directions))
        timer.mark("merge")
        return RenderResult(rgb, opacity, depth, seg.n_samples, seg.n_candidates)

    def take_step_samples(self) -> int:
        """The samples the ray budget adapts to this step: per backward pass the largest count of a rank
        in the replica (the same on its K ranks, so they keep drawing equal ray counts), summed."""
        total = sum(self.step_samples)
        self.step_samples = []
        return total

    def render_image(
        self,
        field,
        origins: Tensor,
        directions: Tensor,
        grid: OccupancyGrid | None,
        schedule: StepSchedule,
        background: Tensor,
        early_termination: float,
        chunk: int,
        step_offset: float = 0.5,
    ) -> tuple[Tensor, Tensor]:
        """``render.render_image`` through the exchange (collective in the replica group; every rank of the
        replica passes the same rays and ``chunk``): rgb on ``background`` ``[R, 3]``, depth ``[R]``."""

        def render(o: Tensor, d: Tensor, j: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
            out = self(field, field.density, o, d, field.aabb, grid, schedule, early_termination, j)
            return out.rgb, out.opacity, out.depth

        image = render_in_chunks(render, origins, directions, background, chunk, step_offset)
        self.step_samples = []
        return image

    def view_share(self) -> tuple[int, int]:
        """Evaluation: replica d renders views d, d + D, ... (its K ranks together)."""
        return self.groups.replica, self.groups.replicas

    @property
    def reports(self) -> bool:
        """Whether this rank adds its replica's scores and images (region 0 of each replica)."""
        return self.region == 0

    # -------------------------------------------------------------------------------- monitoring

    def replica_table(self, table: np.ndarray) -> np.ndarray:
        """The monitor's ``[N, F]`` table as ``[D, F]``, one row per replica (for the data pipeline and the
        balancer, which deal rays to replicas): the slowest rank's times and steps, the shared rays, loss
        and error, the replica's summed samples."""
        k = self.groups.model_parallel
        t = table.reshape(-1, k, table.shape[1])
        out = t.max(axis=1)
        for name in ("rays", "loss_sum", "mse_sum"):
            out[:, COL[name]] = t[:, :, COL[name]].mean(axis=1)
        out[:, COL["samples"]] = t[:, :, COL["samples"]].sum(axis=1)
        return out

    def interval_report(self, table: np.ndarray, steps: int) -> dict:
        """Collective (one small allgather): exchange bytes and time per step of every rank, samples per
        region (from the monitor's table) and their spread."""
        s = self.stats.take()
        mine = [s.bytes / max(steps, 1), s.seconds / max(steps, 1)]
        everyone = dist.allgather_object(mine, name="model_parallel.report")
        k = self.groups.model_parallel
        samples = table[:, COL["samples"]].reshape(-1, k).sum(axis=0) / max(steps, 1)  # per region per step
        spread = float((samples.max() - samples.min()) / max(samples.max(), 1e-9))
        return {
            "exchange_bytes_per_step": [round(b) for b, _ in everyone],
            "exchange_ms_per_step": [round(1e3 * t, 3) for _, t in everyone],
            "samples_per_region": [round(float(v), 1) for v in samples],
            "region_work_spread": round(spread, 4),
        }

    @staticmethod
    def describe_report(r: dict) -> str:
        ex_b, ex_t = r["exchange_bytes_per_step"], r["exchange_ms_per_step"]
        return (
            f"model parallel: exchange {max(ex_b) / 1024:.1f} KiB/step, {max(ex_t):.2f} ms/step (slowest rank); "
            f"samples/step per region [{', '.join(f'{v:.0f}' for v in r['samples_per_region'])}], "
            f"spread {100 * r['region_work_spread']:.0f}%"
        )
