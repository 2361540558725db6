"""One rank's training data, assembled from the ``data`` options: placement, shard, sampling, balance.

Built once by ``DataPipeline.build`` (collective: complexity features are computed by all ranks
together). Then, per training step, ``sample(n)`` and ``observe(...)`` (the error map; every
``--error_map_interval`` steps a collective reduction), and per log interval
``end_interval(table)`` with the monitor's reduced table: the epoch (new shards once the ranks
together have drawn ``--epoch_passes`` rays per training pixel), the load balance and the
resolution (``--dynamic_resolution``) — decided identically on every rank from the same table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..cluster import dist
from ..errors import ConfigError
from ..observe.metrics import COL
from .balance import Balancer, RankTimes, check_options as check_balance_options
from .complexity import complexity_scores, scene_features
from .error_map import ErrorMap
from .pixels import GIB, Placement, StackedPixels, StreamedPixels, plan_placement, stream_chunk
from .sampler import RayBatch, RaySampler
from .scene import Frames

STRATEGIES = ("uniform", "complexity", "error_map")


@dataclass(frozen=True)
class DataFlags:
    """The ``data`` option group as parsed (``DataSettings.add_options`` declares each flag), not yet validated."""

    sampling: str
    train_ray_jitter: str  # on | off
    fused_draw: str
    sampling_floor: float
    importance_weights: str  # on | off
    complexity_weights: str  # "EDGES,LAPLACIAN"
    error_map_interval: int
    error_map_decay: float
    tile_size: int
    shard_by: str
    epoch_passes: float
    balance: str
    balance_threshold: float
    preload: str
    image_dtype: str
    device_image_budget_gb: float
    host_image_budget_gb: float
    num_workers: int
    dynamic_resolution: int
    dynamic_resolution_plateau: float


@dataclass(frozen=True)
class DataSettings:
    """The ``data`` option group, validated."""

    sampling: str
    floor: float
    importance_weights: bool
    complexity_weights: tuple[float, float]
    error_map_interval: int
    error_map_decay: float
    tile_size: int
    shard_by: str
    epoch_passes: float
    balance: str
    balance_threshold: float
    preload: str
    image_dtype: str
    device_image_budget_gb: float
    host_image_budget_gb: float
    num_workers: int
    dynamic_resolution: int
    dynamic_resolution_plateau: float
    train_ray_jitter: bool = False
    fused_draw: str = "auto"

    @staticmethod
    def add_options(p: argparse.ArgumentParser) -> None:
        """Declare the data option group (parsed into ``DataFlags``, validated by ``from_flags``)."""
        g = p.add_argument_group("data: shards, sampling, load balance, image memory")
        g.add_argument(
            "--sampling",
            choices=("uniform", "complexity", "error_map"),
            default="uniform",
            help="how rays are drawn: uniformly over this rank's pixels, by image complexity (OpenCV edges + "
            "Laplacian), or by the training loss (instant-ngp error map)",
        )
        g.add_argument(
            "--train_ray_jitter",
            choices=("on", "off"),
            default="off",
            help="off: training rays through pixel centres (instant-ngp's snap_to_pixel_centers, and how "
            "evaluation renders); on: a random position inside the pixel",
        )
        g.add_argument(
            "--fused_draw",
            choices=("auto", "off"),
            default="auto",
            help="auto: on a CUDA GPU with the images there, pinhole cameras without distortion and "
            "full resolution, draw each batch of training rays in one Triton kernel instead of about "
            "forty small ones (the same random numbers, pixels and colours); off: the torch path, "
            "the reference",
        )
        g.add_argument(
            "--sampling_floor",
            type=float,
            default=0.25,
            help="share of rays drawn uniformly whatever the strategy, so no pixel starves (bounds importance "
            "weights by 1/floor)",
        )
        g.add_argument(
            "--importance_weights",
            choices=("on", "off"),
            default="on",
            help="on: weight each ray's loss by uniform/sampling probability, so the gradient is that of the "
            "mean over all pixels; off: the strategy reweights the objective (instant-ngp); the reported "
            "loss and PSNR are weighted either way",
        )
        g.add_argument(
            "--complexity_weights",
            default="0.3,0.7",
            metavar="EDGES,LAPLACIAN",
            help="weights of the edge-density and Laplacian terms of the complexity score",
        )
        g.add_argument(
            "--error_map_interval",
            type=int,
            default=128,
            help="steps between error-map reductions across ranks (and new sampling distributions)",
        )
        g.add_argument(
            "--error_map_decay",
            type=float,
            default=0.5,
            help="weight of a tile's previous error when a new interval's mean loss arrives",
        )
        g.add_argument(
            "--tile_size",
            type=int,
            default=0,
            help="pixels per side of the tiles that shards, complexity and error map are made of (0: 32, "
            "larger for very large scenes)",
        )
        g.add_argument(
            "--shard_by",
            choices=("tile", "image"),
            default="tile",
            help="unit dealt to ranks (streamed scenes always shard whole images)",
        )
        g.add_argument(
            "--epoch_passes",
            type=float,
            default=1.0,
            help="an epoch ends (and shards are dealt again) when the ranks together have drawn this many "
            "rays per training pixel",
        )
        g.add_argument(
            "--balance",
            choices=("off", "samples", "time"),
            default="samples",
            help="off: equal rays per rank; samples: each rank sizes its batch to --target_samples "
            "(deterministic); time: samples, and ranks whose step times drift apart get sample targets "
            "by their throughput (follows measured times, so runs are not bit-reproducible)",
        )
        g.add_argument(
            "--balance_threshold",
            type=float,
            default=0.05,
            help="rebalance when (max - min) / max of the per-rank step times exceeds this",
        )
        g.add_argument(
            "--preload",
            choices=("auto", "device", "gpu", "host", "stream"),
            default="auto",
            help="training images on the device (gpu), in pinned host memory (copied per batch), or streamed "
            "from disk by shard; auto: the first that fits its budget",
        )
        g.add_argument(
            "--image_dtype",
            choices=("uint8", "fp16"),
            default="uint8",
            help="storage of preloaded images (fp16 doubles the memory)",
        )
        g.add_argument(
            "--device_image_budget_gb",
            type=float,
            default=0.0,
            help="device memory the training images may use (0: what the process's memory budget leaves, "
            "at most a quarter of the GPU)",
        )
        g.add_argument(
            "--host_image_budget_gb",
            type=float,
            default=0.0,
            help="host memory per rank the training images may use (0: half the available memory / local ranks)",
        )
        g.add_argument(
            "--num_workers", type=int, default=4, help="threads decoding images (at load and when streaming)"
        )
        g.add_argument(
            "--dynamic_resolution",
            type=int,
            default=0,
            metavar="F",
            help="start training at 1/F resolution (F a power of two) and double it whenever the loss stops "
            "falling (0: off)",
        )
        g.add_argument(
            "--dynamic_resolution_plateau",
            type=float,
            default=0.05,
            help="raise the resolution when a log interval lowers the loss by less than this fraction",
        )

    @staticmethod
    def from_flags(flags: DataFlags) -> "DataSettings":
        """Validate the options; raises ``ConfigError`` saying what was expected."""
        if flags.sampling not in STRATEGIES:
            raise ConfigError(f"--sampling must be one of {', '.join(STRATEGIES)}, got {flags.sampling!r}")
        if not 0.0 < flags.sampling_floor <= 1.0:
            raise ConfigError(f"--sampling_floor must be in (0, 1], got {flags.sampling_floor}")
        try:
            weights = tuple(float(v) for v in str(flags.complexity_weights).split(","))
        except ValueError:
            weights = ()
        if len(weights) != 2 or min(weights) < 0 or sum(weights) <= 0:
            raise ConfigError(
                f"--complexity_weights must be two numbers >= 0 (edges,laplacian), got {flags.complexity_weights!r}"
            )
        for name in ("error_map_interval", "num_workers"):
            if getattr(flags, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(flags, name)}")
        if not 0.0 <= flags.error_map_decay < 1.0:
            raise ConfigError(f"--error_map_decay must be in [0, 1), got {flags.error_map_decay}")
        if flags.tile_size < 0:
            raise ConfigError(f"--tile_size must be >= 0 (0: automatic), got {flags.tile_size}")
        if flags.epoch_passes <= 0:
            raise ConfigError(f"--epoch_passes must be positive, got {flags.epoch_passes}")
        check_balance_options(flags.balance, flags.balance_threshold)
        for name in ("device_image_budget_gb", "host_image_budget_gb"):
            if getattr(flags, name) < 0:
                raise ConfigError(f"--{name} must be >= 0 (0: automatic), got {getattr(flags, name)}")
        dyn = flags.dynamic_resolution
        if dyn < 0 or (dyn > 1 and dyn & (dyn - 1)):
            raise ConfigError(
                f"--dynamic_resolution must be 0 (off) or a power of two (the starting downscale), got {dyn}"
            )
        if flags.tile_size and dyn > 1 and flags.tile_size % dyn:
            raise ConfigError(f"--dynamic_resolution {dyn} must divide --tile_size {flags.tile_size}")
        if not 0.0 <= flags.dynamic_resolution_plateau < 1.0:
            raise ConfigError(f"--dynamic_resolution_plateau must be in [0, 1), got {flags.dynamic_resolution_plateau}")
        return DataSettings(
            flags.sampling,
            float(flags.sampling_floor),
            flags.importance_weights == "on",
            weights,
            int(flags.error_map_interval),
            float(flags.error_map_decay),
            int(flags.tile_size),
            flags.shard_by,
            float(flags.epoch_passes),
            flags.balance,
            float(flags.balance_threshold),
            "device" if flags.preload == "gpu" else flags.preload,
            flags.image_dtype,
            float(flags.device_image_budget_gb),
            float(flags.host_image_budget_gb),
            int(flags.num_workers),
            max(int(dyn), 1),
            float(flags.dynamic_resolution_plateau),
            flags.train_ray_jitter == "on",
            flags.fused_draw,
        )


def make_store(
    frames: Frames, placement: Placement, device: torch.device, settings: DataSettings
) -> StackedPixels | StreamedPixels:
    """The pixel store for ``placement`` (decodes the images for device and host placements)."""
    if placement.mode == "stream":
        return StreamedPixels(frames, device, stream_chunk(placement, frames.sizes), settings.num_workers)
    return StackedPixels(
        frames,
        device,
        on_device=placement.mode == "device",
        image_dtype=settings.image_dtype,
        workers=settings.num_workers,
    )


def agree_placement(placement: Placement) -> Placement:
    """The most conservative of the ranks' placements (collective): memory differs between nodes, and
    ranks that disagreed would shard differently (streamed scenes shard whole images). Elastic jobs make
    no collective before the training loop (a rank that joins later builds alone): each rank keeps its own."""
    if dist.elastic():
        return placement
    order = ("device", "host", "stream")
    mine = torch.tensor([float(order.index(placement.mode))])
    agreed = order[int(dist.allreduce(mine, "max", name="data.placement")[0])]
    return placement if agreed == placement.mode else replace(placement, mode=agreed)


class DataPipeline:
    """Sampler, store, error map and balancer of one rank (see the module docstring)."""

    def __init__(
        self,
        settings: DataSettings,
        sampler: RaySampler,
        placement: Placement,
        balancer: Balancer,
        error_map: ErrorMap | None,
    ) -> None:
        self.settings = settings
        self.sampler = sampler
        self.placement = placement
        self.balancer = balancer
        self.error_map = error_map
        self.complexity: Tensor | None = None  # per-tile scores of --sampling complexity
        self.rays_drawn = 0.0  # by all ranks, counted from the monitor's tables
        self.resolution = settings.dynamic_resolution
        self._previous_loss: float | None = None
        self.complexity_from_cache: bool | None = None

    @staticmethod
    def build(
        frames: Frames,
        settings: DataSettings,
        rt: dist.Runtime,
        seed: int,
        target_samples: int,
        max_rays: int,
        scene_cache: str | None = None,
        device_budget: int | None = None,
    ) -> "DataPipeline":
        """Everything from the options (collective, except in elastic jobs: every rank calls it): ``settings``
        validated by ``config.validate``; ``seed``, ``target_samples`` and ``max_rays``: the step's
        (``--seed``, ``--target_samples``, ``--max_rays``). ``device_budget``: bytes of device memory the images
        may use when ``--device_image_budget_gb`` is 0 (what the process's memory budget leaves; None: a quarter
        of the GPU)."""
        device_gb = settings.device_image_budget_gb
        if device_gb == 0 and device_budget is not None and rt.device.type == "cuda":
            quarter = torch.cuda.get_device_properties(rt.device).total_memory // 4
            device_gb = max(min(device_budget, quarter), 1) / GIB
        placement = agree_placement(
            plan_placement(
                settings.preload,
                frames.sizes,
                rt.device,
                settings.image_dtype,
                device_gb,
                settings.host_image_budget_gb,
                rt.local_size,
            )
        )
        shard_by = "image" if placement.mode == "stream" else settings.shard_by

        def build_sampler() -> RaySampler:
            store = make_store(frames, placement, rt.device, settings)
            return RaySampler(
                frames,
                rt.rank,
                rt.size,
                seed,
                rt.device,
                settings.train_ray_jitter,
                store=store,
                tile_size=settings.tile_size,
                shard_by=shard_by,
                floor=settings.floor,
                fused=settings.fused_draw,
            )

        sampler = build_sampler() if dist.elastic() else dist.agree(build_sampler, "loading the training images")
        pipeline = DataPipeline(
            settings,
            sampler,
            placement,
            Balancer(settings.balance, rt.rank, rt.size, target_samples, settings.balance_threshold, max_rays),
            ErrorMap(sampler.grid.n_tiles, rt.device, settings.error_map_decay)
            if settings.sampling == "error_map"
            else None,
        )
        if settings.sampling == "complexity":
            paths = frames.files.paths if frames.files is not None else [Path(n) for n in frames.names]
            downscale = frames.files.downscale if frames.files is not None else 1
            features, pipeline.complexity_from_cache = scene_features(
                sampler.grid, sampler.store.image, paths, downscale, scene_cache
            )
            pipeline.complexity = complexity_scores(features, settings.complexity_weights)
            sampler.set_scores(pipeline.complexity)
        if pipeline.resolution > 1:
            if sampler.tile_size % pipeline.resolution:
                raise ConfigError(
                    f"--dynamic_resolution {pipeline.resolution} must divide the tile size "
                    f"{sampler.tile_size} (set --tile_size)"
                )
            sampler.set_resolution(pipeline.resolution)
        return pipeline

    def new_sampler(self, rank: int, size: int, seed: int) -> RaySampler:
        """The sampler of shard ``rank`` of ``size`` drawing with ``seed``, on the same images, strategy and
        resolution (a world-size change or a resume re-deals the shards); the current one when nothing changed."""
        old = self.sampler
        if (rank, size, seed) == (old.rank, old.world_size, old.seed):
            return old
        old.stop_prefetch()
        sampler = RaySampler(
            old.frames,
            rank,
            size,
            seed,
            old.device,
            old.jitter,
            store=old.store,
            tile_size=old.tile_size,
            shard_by=old.shard_by,
            epoch=max(old.epoch, 0),
            floor=old.floor,
            fused=old.fused,
        )
        scores = self.complexity if self.error_map is None or not self.error_map.updates else self.error_map.error
        if scores is not None:
            sampler.set_scores(scores)
        if self.resolution > 1:
            sampler.set_resolution(self.resolution)
        if (rank, size) != (self.balancer.rank, self.balancer.world_size):  # a new world starts balanced
            b = self.balancer
            self.balancer = Balancer(b.mode, rank, size, b.target, b.threshold, b.max_rays)
        self.sampler = sampler
        return sampler

    # -------------------------------------------------------------------------------- per step

    @property
    def loss_scale(self) -> float:
        return self.balancer.loss_scale

    def sample(self, n_rays: int) -> RayBatch:
        return self.sampler.sample(n_rays)

    def observe(self, step: int, rays: RayBatch, ray_loss: Tensor | None, valid: Tensor | None) -> None:
        """After training step ``step``: feed the error map (device ops only); every ``error_map_interval``
        steps reduce it across ranks and resample from it (collective: every rank, same step)."""
        if self.error_map is None:
            return
        if ray_loss is not None and rays.tile is not None:
            self.error_map.record(rays.tile, ray_loss, valid)
        if (step + 1) % self.settings.error_map_interval == 0:
            self.sampler.set_scores(self.error_map.reduce())

    # -------------------------------------------------------------------------------- per interval

    def end_interval(self, table: np.ndarray) -> list[str]:
        """Epoch, balance and resolution from the monitor's reduced table (identical on every rank, no
        collective). Returns lines worth logging."""
        notes = []
        self.rays_drawn += float(table[:, COL["rays"]].sum())
        epoch = int(self.rays_drawn // (self.settings.epoch_passes * self.sampler.n_pixels))
        if epoch != self.sampler.epoch:
            self.sampler.set_epoch(epoch)
            notes.append(f"epoch {epoch}: new shards ({self.sampler.shard_size} pixels on this rank)")
        times = RankTimes.from_table(table, COL)
        if self.balancer.update(times):
            spread = self.balancer.last_spread
            assert spread is not None  # update() has just measured it
            notes.append(
                f"rebalanced (step time spread {100 * spread:.0f}%): sample targets "
                f"per rank x [{self.balancer.describe()}]"
            )
        if self.resolution > 1:
            steps = max(float(table[:, COL["steps"]].max()), 1.0)
            loss = float(table[:, COL["loss_sum"]].sum()) / table.shape[0] / steps
            prev = self._previous_loss
            if prev is not None and prev > 0 and (prev - loss) / prev < self.settings.dynamic_resolution_plateau:
                self.resolution //= 2
                self.sampler.set_resolution(self.resolution)
                self._previous_loss = None  # the loss jumps at the finer resolution: compare from the next interval
                notes.append(f"resolution raised to 1/{self.resolution} (loss {loss:.5f}, was {prev:.5f})")
            else:
                self._previous_loss = loss
        return notes

    def describe(self) -> str:
        s, smp = self.settings, self.sampler
        parts = [
            f"images {self.placement.describe()}",
            f"shards by {smp.shard_by} ({smp.tile_size} px tiles, {smp.grid.n_tiles} in all)",
            "training rays "
            + ("jittered inside pixels" if s.train_ray_jitter else "through pixel centres")
            + (", drawn by one Triton kernel" if smp.fused_why_not is None else ""),
            f"sampling {s.sampling}"
            + (
                f" (floor {s.floor:g}, importance weights {'on' if s.importance_weights else 'off'})"
                if s.sampling != "uniform"
                else ""
            ),
            f"balance {s.balance}",
        ]
        if self.complexity_from_cache is not None:
            parts.append("complexity scores " + ("from the cache" if self.complexity_from_cache else "computed"))
        if self.resolution > 1:
            parts.append(f"dynamic resolution from 1/{self.resolution}")
        return "data: " + ", ".join(parts)

    def stream_report(self) -> str | None:
        store = self.sampler.store
        if not isinstance(store, StreamedPixels):
            return None
        return (
            f"streamed {store.decoded} image decodes in chunks of {store.chunk}, {store.rotations} rotations, "
            f"{store.wait_seconds:.1f} s waiting for decoding"
        )

    def summary(self) -> dict:
        """Decisions that every rank must share (a parallel test compares them across ranks) and figures for
        reports: placement, epoch, resolution, sample shares of the ranks, rebalances, an error-map checksum."""
        b = self.balancer
        return {
            "placement": self.placement.mode,
            "sampling": self.settings.sampling,
            "balance": b.mode,
            "epoch": self.sampler.epoch,
            "resolution": self.resolution,
            "shard_by": self.sampler.shard_by,
            "tile_size": self.sampler.tile_size,
            "sample_shares": [round(float(v), 6) for v in b.shares],
            "rebalances": b.rebalances,
            "equal_rays": b.equal_rays,
            "error_map_sum": None if self.error_map is None else float(self.error_map.error.sum()),
            "error_map_updates": None if self.error_map is None else self.error_map.updates,
        }

    def state_dict(self) -> dict:
        """What a resumed run needs to continue the same data schedule (JSON-able: checkpoints keep it in
        the run's progress record)."""
        return {
            "epoch": self.sampler.epoch,
            "rays_drawn": self.rays_drawn,
            "resolution": self.resolution,
            "balancer": self.balancer.state_dict(),
            "error_map": None if self.error_map is None else self.error_map.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.rays_drawn = float(state["rays_drawn"])
        self.balancer.load_state_dict(state["balancer"])
        if self.error_map is not None and state.get("error_map") is not None:
            self.error_map.load_state_dict(state["error_map"])
            if self.error_map.updates:
                self.sampler.set_scores(self.error_map.error)
        if int(state["resolution"]) != self.resolution:
            self.resolution = int(state["resolution"])
            self.sampler.set_resolution(self.resolution)
        self.sampler.set_epoch(int(state["epoch"]))

    def close(self) -> None:
        self.sampler.close()
