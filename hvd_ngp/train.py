"""Entry point: ``python -m hvd_ngp.train`` (size 1) or under ``horovodrun``/``mpirun`` (N ranks).

The loop, every rank, every step: occupancy update (every ``update_interval`` steps, collective) ->
sample this rank's rays -> march + render -> loss -> backward -> Horovod allreduce inside
``optimizer.step()``. Metrics are reduced once per log interval; rank 0 prints and writes files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import tempfile
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

import torch
import torch.nn.functional as F
from torch import Tensor

from .state import checkpoint
from . import faultpoints
from .cluster import dist, elastic, preempt
from .state.checkpoint import CheckpointManager, resume
from .cluster.comm import CommSettings
from .config import CPU_CONFIG, BASE_CONFIG, UNLIMITED_STEPS, parse_args
from .data import Scene, load_scene
from .data.pipeline import DataPipeline
from .data.sampler import RayBatch, RaySampler
from .model.encoding import FAST_RENDERER_BACKENDS, resolve_backend
from .model.encoding.hashgrid import HashGridSpec
from .errors import ConfigError, run_cli
from .state.failures import NonFiniteGuard, Watchdog, report
from .model.field import NGPField
from .state.trainstate import TrainState, make_rank_streams
from .observe.clock import TrainClock
from .training.evaluate import BACKGROUNDS, composite_background, evaluate
from .cluster.hvdtools import apply as apply_horovod_tools
from .observe.memory import (EVAL_RESERVE, GIB, STEP_COSTS, MemoryBudget, MemoryMeter, TrainingFootprint, check_fit,
                             human_gib, out_of_memory_as_error, ranks_on_device, training_footprint)
from .observe.monitor import Monitor, MonitorSettings
from .render.occupancy import OccupancyGrid, n_cascades_for
from .training.optim import Adam, OptimizerChain, exponential_decay, make_ema
from .observe.profiling import NULL_TIMER, StageTimer

if TYPE_CHECKING:  # the fast renderer needs Triton: imported only when selected
    from .render.fast import FastRenderer
from .render import StepSchedule, render_rays


# ------------------------------------------------------------------------------------ recipe


@dataclass(frozen=True)
class Marching:
    """Ray-marching settings derived from the ``marching`` block and the scene."""

    schedule: StepSchedule
    early_termination: float
    update_interval: int
    warmup_steps: int

    @staticmethod
    def from_config(block: dict, scene_aabb_scale: int, source: str = "config") -> "Marching":
        """instant-ngp's constants: ``dt_min = sqrt(3) / steps_per_diagonal`` (the unit cube's diagonal),
        cone angle 1/256 for scenes larger than the unit cube ("auto"), and at most
        ``dt_min * 2^(cascades-1) * steps_per_diagonal / grid_resolution``."""
        steps = int(block["steps_per_diagonal"])
        res = int(block["grid_resolution"])
        if steps <= 0 or res <= 0:
            raise ConfigError(f"{source}: marching.steps_per_diagonal and grid_resolution must be positive")
        cone = block.get("cone_angle", "auto")
        if cone == "auto":
            cone = 0.0 if scene_aabb_scale <= 1 else 1.0 / 256
        if not isinstance(cone, (int, float)) or cone < 0:
            raise ConfigError(f"{source}: marching.cone_angle must be 'auto' or a number >= 0, got {cone!r}")
        dt_min = math.sqrt(3.0) / steps
        dt_max = dt_min * 2 ** (n_cascades_for(scene_aabb_scale) - 1) * max(steps / res, 1.0)
        near = float(block.get("near_distance", 0.1))
        if near < 0:
            raise ConfigError(f"{source}: marching.near_distance must be >= 0, got {near}")
        schedule = StepSchedule(dt_min, dt_max, float(cone), int(block.get("max_steps", 4096)), near)
        return Marching(schedule, float(block["early_termination"]), int(block["update_interval"]),
                        int(block["warmup_steps"]))


def make_grid(block: dict, scene: Scene) -> OccupancyGrid:
    return OccupancyGrid(scene.aabb, int(block["grid_resolution"]), n_cascades_for(scene.aabb_scale),
                         float(block["threshold"]), float(block["decay"]))


def make_optimizer(field: NGPField, block: dict, source: str) -> tuple[torch.optim.Adam, callable]:
    """Adam (L2 on the MLP weights only; the hash table sparse with ``sparse_hash_updates``) and
    ``lr_at(step)`` for the ExponentialDecay schedule (see ``optim``)."""
    chain = OptimizerChain.parse(block, source)
    adam = chain.adam
    lr = float(adam.get("learning_rate", 1e-2))
    opt = Adam(
        [{"params": field.encoding_parameters(), "weight_decay": 0.0,
          "sparse": bool(adam.get("sparse_hash_updates", False))},
         {"params": field.mlp_parameters(), "weight_decay": float(adam.get("l2_reg", 1e-6))}],
        lr=lr, betas=(float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.99))),
        eps=float(adam.get("epsilon", 1e-15)))

    def lr_at(step: int) -> float:
        return lr * exponential_decay(step, chain.decay)

    return opt, lr_at


def make_loss(block: dict, source: str):
    """The ``loss`` block -> an element-wise loss ``(pred, target) -> [R, 3]`` (reduced by ``masked_mean``)."""
    otype = block.get("otype", "L2")
    if otype == "L2":
        return lambda pred, target: (pred - target) ** 2
    if otype == "Huber":
        delta = float(block.get("delta", 0.1))
        return lambda pred, target: F.huber_loss(pred, target, delta=delta, reduction="none") / delta
    if otype == "L1":
        return lambda pred, target: (pred - target).abs()
    raise ConfigError(f"{source}: loss.otype {otype!r} is unknown (L2, Huber, L1)")


def masked_mean(values: Tensor, valid: Tensor | None, weight: Tensor | None = None) -> Tensor:
    """Mean of ``[R, C]`` values over the rays where ``valid`` ``[R]`` holds (all when None), each ray's
    values multiplied by its importance ``weight`` ``[R]`` (None: 1); no host sync."""
    if valid is None and weight is None:
        return values.mean()
    count = values.new_tensor(float(values.shape[0])) if valid is None else valid.to(values.dtype).sum()
    w = torch.ones_like(values[:, 0]) if valid is None else valid.to(values.dtype)
    if weight is not None:
        w = w * weight.to(values.dtype)
    return (values * w[:, None]).sum() / (count * values.shape[1]).clamp(min=1.0)


# ------------------------------------------------------------------------------------ one step


@dataclass
class StepResult:
    """loss, mse: device scalars; n_samples (through the network), n_candidates (marched): ints on the
    reference path, device scalars on the fast path (read them without blocking: see ``RayBudget``)."""

    loss: Tensor
    mse: Tensor
    n_samples: int | Tensor
    n_candidates: int | Tensor
    n_valid: int | Tensor
    skipped: bool = False  # a non-finite loss or gradients on some rank: no rank took the optimizer step
    ray_loss: Tensor | None = None
    valid: Tensor | None = None


AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def train_step(field: NGPField, grid: OccupancyGrid, optimizer: torch.optim.Optimizer, rays: RayBatch,
               background: Tensor, march: Marching, loss_fn, jitter: Tensor | None, precision: str = "fp32",
               scaler: torch.amp.GradScaler | None = None, renderer: FastRenderer | None = None,
               timer: StageTimer = NULL_TIMER, backward_passes: int = 1, guard: NonFiniteGuard | None = None,
               step: int = 0, weight_gradient: bool = True, loss_scale: float = 1.0) -> StepResult:
    """Render ``rays``, compare with their pixels on ``background`` ``[R, 3]``, and take one optimizer step.

    ``rays.weight`` (importance weights of non-uniform sampling) always weight the reported loss and
    MSE; they weight the gradient when ``weight_gradient``. ``loss_scale`` multiplies the loss that is
    back-propagated (a rank's share of the step's rays, see ``data.balance``).

    ``renderer``: the fast GPU renderer, or None for the reference (``render.render_rays``).
    ``backward_passes`` > 1 splits the rays into that many chunks with one backward pass each
    (gradient accumulation, Horovod's ``backward_passes_per_step``); each chunk's loss is weighted
    by its share of the rays, so on the reference path the summed gradient is the whole batch's.
    Every rank calls this every step, even with no samples: the allreduce inside ``optimizer.step()``
    must see every rank. With a gradient scaler (fp16 autocast or fp16 compression), Horovod's
    pattern: synchronize (allreduce), unscale, then step without a second synchronisation. With a
    ``guard``, every rank skips the optimizer step when the loss or the reduced gradients are
    non-finite on any rank (``step``: the 1-based step number, for messages and test faults).
    """
    device_type = rays.origins.device.type
    render = renderer or render_rays
    target = composite_background(rays.rgba, background)
    n = len(rays)
    bounds = [round(i * n / backward_passes) for i in range(backward_passes + 1)]
    loss = mse = torch.zeros((), device=rays.origins.device)
    n_samples = n_candidates = n_valid = 0
    ray_loss: list[Tensor] = []
    valids: list[Tensor | None] = []
    optimizer.zero_grad()
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a == b:
            continue
        part, share = slice(a, b), (b - a) / n
        with torch.autocast(device_type, dtype=AUTOCAST.get(precision, torch.float32), enabled=precision in AUTOCAST):
            out = render(field, lambda x: field.query_density(x)[0], rays.origins[part], rays.directions[part],
                         field.aabb, grid, march.schedule, march.early_termination,
                         None if jitter is None else jitter[part], timer=timer)
        valid = getattr(out, "valid", None)
        weight = None if rays.weight is None else rays.weight[part]
        pred = out.rgb.float() + background[part] * (1.0 - out.opacity.float()[:, None])
        per_channel = loss_fn(pred, target[part])
        part_loss = faultpoints.poison_loss(masked_mean(per_channel, valid, weight), step) * share  # test hook
        trained = part_loss if weight_gradient or weight is None else \
            faultpoints.poison_loss(masked_mean(per_channel, valid), step) * share
        if loss_scale != 1.0:
            trained = trained * loss_scale
        (trained if scaler is None else scaler.scale(trained)).backward()
        loss = loss + part_loss.detach()
        mse = mse + masked_mean((pred.detach() - target[part]) ** 2, valid, weight) * share
        n_samples, n_candidates = n_samples + out.n_samples, n_candidates + out.n_candidates
        n_valid = n_valid + ((b - a) if valid is None else valid.sum())
        ray_loss.append(per_channel.detach().float().mean(dim=1))
        valids.append(valid)
    timer.mark("backward")
    if guard is not None:
        guard.submit(loss)
    distributed = hasattr(optimizer, "synchronize")  # Horovod DistributedOptimizer
    if distributed:
        optimizer.synchronize()  # waits for the gradient allreduce started during backward
        timer.mark("allreduce")
    skipped = guard is not None and guard.should_skip(optimizer, step, check_gradients=scaler is None)
    if not skipped:
        if scaler is not None:
            scaler.unscale_(optimizer)
        if distributed:
            with optimizer.skip_synchronize():
                optimizer.step() if scaler is None else scaler.step(optimizer)
        else:
            optimizer.step() if scaler is None else scaler.step(optimizer)
        if scaler is not None:
            scaler.update()
    timer.mark("optimizer")
    all_valid = None if all(v is None for v in valids) else torch.cat(
        [torch.ones(len(r), dtype=torch.bool, device=r.device) if v is None else v for r, v in zip(ray_loss, valids)])
    return StepResult(loss, mse, n_samples, n_candidates, n_valid, skipped,
                      torch.cat(ray_loss) if ray_loss else None, all_valid)


def make_scaler(precision: str, comm: CommSettings, device: torch.device, size: int) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 autocast, or for fp16-compressed gradients when ranks average them.

    Half precision flushes gradients below 6e-8 to zero and keeps little precision below 6e-5, where
    most hash-grid and density-MLP gradients live (median 1e-6 and 3e-8 on the tiny CPU config), so
    fp16 compression runs under dynamic loss scaling (initial scale 2^16): an overflow gives inf
    after the allreduce, the same on every rank, and every rank skips that step and halves the scale.
    """
    if precision == "fp16" or (comm.loss_scaled_compression and size > 1):
        return torch.amp.GradScaler(device.type)
    return None


class RayBudget:
    """Rays per step, adapted so a step carries about ``target`` samples through the network
    (instant-ngp's rule) and, on the fast path, its marched samples fit ``candidate_capacity``.

    Fast-path counts are device scalars: they are copied to pinned host memory without blocking
    and used once the copy has landed (a step or two later), so the host never waits for the GPU.
    """

    def __init__(self, n_rays: int, target: int, max_rays: int, candidate_capacity: int | None = None) -> None:
        self.n_rays, self.target, self.max_rays = n_rays, target, max_rays
        self.candidate_capacity = candidate_capacity
        self.fixed: int | None = None  # set: always this many rays (--balance off)
        self._pending: list[tuple[torch.cuda.Event | None, Tensor]] = []

    def _adapt(self, samples: float, candidates: float, valid: float) -> None:
        per_ray = max(samples, 1.0) / max(valid, 1.0)
        n = self.target / per_ray
        if self.candidate_capacity:
            n = min(0.95 * n, 0.95 * self.candidate_capacity / (max(candidates, 1.0) / max(valid, 1.0)))
        self.n_rays = int(min(max(n, 64), self.max_rays)) // 64 * 64
        if self.fixed is not None:
            self.n_rays = self.fixed

    def update(self, res: StepResult) -> int:
        if not isinstance(res.n_samples, Tensor):
            self._adapt(res.n_samples, res.n_candidates, res.n_valid)
            return self.n_rays
        counts = torch.stack([torch.as_tensor(v, device=res.loss.device).float()
                              for v in (res.n_samples, res.n_candidates, res.n_valid)])
        host = torch.empty(3, pin_memory=counts.is_cuda)
        host.copy_(counts, non_blocking=counts.is_cuda)
        event = None
        if counts.is_cuda:
            event = torch.cuda.Event()
            event.record()
        self._pending.append((event, host))
        while self._pending and (self._pending[0][0] is None or self._pending[0][0].query()):
            _, ready = self._pending.pop(0)
            self._adapt(*ready.tolist())
        return self.n_rays

    def settle(self) -> int:
        """Apply every pending count now (waiting for its copy). A checkpoint calls this, so the ray
        count it records is the one the next step uses, in the saved run and in the resumed one."""
        for event, ready in self._pending:
            if event is not None:
                event.synchronize()
            self._adapt(*ready.tolist())
        self._pending.clear()
        return self.n_rays


# ------------------------------------------------------------------------------------ memory

STEP_HINT = "lower --target_samples (or marching.candidate_factor), or raise --gpu_memory_gb"
EVAL_HINT = ("evaluation chunks are planned from --gpu_memory_gb: when other processes share this GPU, set it to this "
             "process's share")


def model_footprint(args: argparse.Namespace, scene: Scene) -> TrainingFootprint:
    """Training's memory from the config alone, before anything is built (``memory.check_fit``)."""
    model = args.model
    n_params = HashGridSpec.from_config(model["encoding"], model["_source"]).n_params + MLP_PARAMS_ALLOWANCE
    block = model["marching"]
    cells = int(block["grid_resolution"]) ** 3 * n_cascades_for(scene.aabb_scale)
    factor = float(block.get("candidate_factor", 4))
    return training_footprint(n_params, PARAMETER_COPIES, cells, int(factor * args.target_samples), args.target_samples,
                              STEP_COSTS)


MLP_PARAMS_ALLOWANCE = 1 << 16  # the two MLPs hold about 10k parameters
PARAMETER_COPIES = 5  # value, gradient, Adam's two moments, the average (Ema)


# ------------------------------------------------------------------------------------ main


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@dataclass
class RunResult:
    """What a training run leaves behind (for tests and benchmarks that drive ``run`` in-process)."""

    field: NGPField
    grid: OccupancyGrid
    step: int
    metrics: dict
    stopped: str | None = None  # "SIGTERM on rank 1", ...: stopped early by a signal (exit EXIT_PREEMPTED)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv, default_config=BASE_CONFIG if torch.cuda.is_available() else CPU_CONFIG)
    except ConfigError as exc:
        report_on_every_rank(exc, "reading the configuration")
    result = run(args)
    return preempt.EXIT_PREEMPTED if result.stopped else 0


def report_on_every_rank(exc: ConfigError, what: str) -> NoReturn:
    """Re-raise ``exc`` (an error before the communicator exists) so that every rank reports it.

    Under a launcher the first rank to exit makes the launcher kill the others, possibly before
    they printed their message; agreeing first makes every rank print it, and a rank whose own
    configuration was fine (another environment) stops too instead of waiting for the others.
    """
    def fail() -> None:
        raise exc

    if dist.launched() and not dist.elastic():
        dist.init("cpu")
        dist.agree(fail, what)
    raise exc


@dataclass
class Trainer:
    """Everything one rank's training steps need, built by ``Trainer.build`` (collective).

    ``state`` holds what a checkpoint saves (see ``trainstate``); ``sampler``, ``generator`` and
    ``start_step`` read through to it, because an elastic reset or a resume replaces them.
    """

    args: argparse.Namespace
    rt: dist.Runtime
    backend: str
    scene: Scene
    field: NGPField
    grid: OccupancyGrid
    march: Marching
    optimizer: torch.optim.Optimizer
    lr_at: object
    loss_fn: object
    scaler: torch.amp.GradScaler | None
    renderer: "FastRenderer | None"
    budget: RayBudget
    state: TrainState
    ckpts: CheckpointManager
    guard: NonFiniteGuard | None
    data: DataPipeline  # placement, sampling strategy, balance; its sampler is ``state.sampler``
    memory: MemoryBudget  # what this process may hold on its device (--gpu_memory_gb)
    meter: MemoryMeter    # peak torch memory of the training step and of evaluation
    budget_lr_factor: float = 1.0  # set by the run loop from the shared training clock (budget_lr_factor())
    stops: preempt.StopVote = dc_field(default_factory=lambda: preempt.StopVote(None))  # agreed stop on signals

    @property
    def sampler(self) -> RaySampler:
        return self.state.sampler

    @property
    def generator(self) -> torch.Generator:  # backgrounds and jitter, seeded by global rank
        return self.state.bg_gen

    @property
    def start_step(self) -> int:
        return self.state.step

    @staticmethod
    def build(args: argparse.Namespace) -> "Trainer":
        comm: CommSettings = args.comm
        apply_horovod_tools(args)  # timeline/autotune/stall-check variables must precede Horovod's init
        rt = dist.init(args.device, args.threads, env=comm.init_env(os.environ, dist.wants_cuda(args.device)))
        use_cuda = rt.device.type == "cuda"
        notes = comm.check_runtime(rt.size, rt.local_size, rt.controller, use_cuda, os.environ)
        elastic.startup_agree(lambda: comm.block.check_host(rt.is_root), "checking the distributed block")
        torch.manual_seed(args.seed)  # identical model init everywhere (and broadcast from rank 0 anyway)
        source = args.model["_source"]
        backend = resolve_backend(args.backend, rt.device)
        dist.log(f"hvd_ngp: {rt.size} rank(s) [{rt.controller}{', elastic' if dist.elastic() else ''}], "
                 f"device {device_name(rt.device)}, config {source}, backend {backend}, host {socket.gethostname()}")
        if rt.size > 1 or comm.backward_passes_per_step > 1:
            dist.log(comm.describe(os.environ, comm.lr_multiplier(rt.size, rt.local_size, use_cuda), rt.cross_size,
                                   notes))
        scene: Scene = elastic.startup_agree(lambda: load_scene(
            args.scene, scene_cache=args.scene_cache, builtin_seed=args.builtin_seed, train_split=args.train_split,
            test_split=args.test_split, holdout_every=args.holdout_every, downscale=args.downscale,
            sharpness_threshold=args.sharpness_threshold, lazy_train=True),
            "loading the scene")
        dist.log(f"scene {scene.source}: {len(scene.train)} train / {len(scene.test)} test views, "
                 f"{scene.train.width}x{scene.train.height}, aabb_scale {scene.aabb_scale}"
                 + (f", {scene.skipped_frames} frame(s) skipped: image missing" if scene.skipped_frames else ""))
        memory = elastic.startup_agree(lambda: MemoryBudget.for_device(rt.device, args.gpu_memory_gb, ranks_on_device(
            rt.local_rank, rt.local_size, torch.cuda.device_count() if use_cuda else 0)), "planning GPU memory")
        footprint = model_footprint(args, scene)
        elastic.startup_agree(lambda: check_fit(memory, footprint, EVAL_RESERVE), "checking the GPU memory budget")
        image_room = None if memory.bytes is None else memory.bytes - footprint.total - EVAL_RESERVE
        data = DataPipeline.build(scene.train, args, rt, args.scene_cache, device_budget=image_room)
        dist.log(data.describe())
        if memory.bytes is not None:
            images = data.placement.nbytes if data.placement.mode == "device" else 0
            dist.log(f"{'GPU memory' if use_cuda else 'memory'}: budget {human_gib(memory.bytes)} ({memory.source}); training needs about "
                     f"{human_gib(footprint.total + images)} ({replace(footprint, images=images).describe()})")

        def build_model() -> tuple:
            model = args.model
            field = NGPField(model, scene.aabb, backend).to(rt.device)
            optimizer, lr_at = make_optimizer(field, model["optimizer"], source)
            return (field, make_grid(model["marching"], scene).to(rt.device),
                    Marching.from_config(model["marching"], scene.aabb_scale, source), optimizer, lr_at,
                    make_loss(model["loss"], source), make_ema(field, OptimizerChain.parse(model["optimizer"], source)))

        field, grid, march, optimizer, lr_at, loss_fn, ema = elastic.startup_agree(build_model, "building the model")
        seen = grid.mark_unseen(scene.train.c2w, scene.train.intrinsics, scene.train.sizes, march.schedule.near)
        dist.log(f"occupancy grid: {100 * seen:.1f}% of the cells are seen by a training camera")
        # wrapped before any state is loaded into it
        optimizer = dist.distributed_optimizer(optimizer, field.named_parameters(), comm.compression,
                                               comm.backward_passes_per_step, comm.reduce_op)

        renderer = None
        if backend in FAST_RENDERER_BACKENDS:
            from .render.fast import FastRenderer

            renderer = FastRenderer(int(args.model["marching"].get("candidate_factor", 4) * args.target_samples),
                                    args.target_samples)
        scaler = make_scaler(args.precision, comm, rt.device, rt.size)
        budget = RayBudget(args.n_rays_init, args.target_samples, args.max_rays,
                           renderer.candidate_capacity if renderer else None)
        state = TrainState(field, grid, optimizer, scaler, *make_rank_streams(scene.train, args.seed, rt.rank, rt.size,
                                                                               rt.device, new_sampler=data.new_sampler),
                           budget, ema=ema)
        ckpts = CheckpointManager(args.ckpt_dir or Path(args.out_dir) / "checkpoints", args.ckpt_every, args.ckpt_keep)
        # stop signals (preempt): installed before the first collective of the resume, agreed in the loop
        stops = preempt.install(getattr(args, "stop_signal_names", ()), dist.elastic())
        guard = NonFiniteGuard(args.nonfinite_limit, stops.local if stops.signals else None) \
            if args.nonfinite_limit else None
        tr = Trainer(args, rt, backend, scene, field, grid, march, optimizer, lr_at, loss_fn, scaler, renderer, budget,
                     state, ckpts, guard, data, memory, MemoryMeter(rt.device), stops=stops)
        resume(state, args.resume or args.load_snapshot, ckpts, tr.reseed, elastic=dist.elastic())
        if "data" in state.progress:  # epoch, balance, error map and resolution of the resumed run
            data.load_state_dict(state.progress["data"])
        return tr

    def lr_multiplier(self) -> float:
        """The learning-rate rule (``--lr_scaling``) for the current world (an elastic one changes size)."""
        rt = dist.runtime()
        return self.args.comm.lr_multiplier(rt.size, rt.local_size, rt.device.type == "cuda")

    def reseed(self) -> None:
        """This rank's shard and fresh random streams for the current world and step (the world changed)."""
        rt = dist.runtime()
        self.state.reseed(self.scene.train, self.args.seed, rt.rank, rt.size, self.data.new_sampler)

    def step(self, step: int, timer: StageTimer = NULL_TIMER) -> tuple[StepResult, int]:
        """Training step number ``step`` (0-based, collective): occupancy refresh when due, rays, render,
        update. Returns the result and the number of rays it used."""
        args, rt = self.args, self.rt
        timer.start()
        faultpoints.at_step(step + 1)  # test-only fault injection (HVD_NGP_FAULTS); a no-op otherwise
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step) * self.lr_multiplier() * self.budget_lr_factor
        if step % self.march.update_interval == 0:
            self.grid.update(lambda x: self.field.query_density(x)[0], self.march.schedule.dt_min, step,
                             self.march.warmup_steps, args.seed)
            timer.mark("occupancy update")
        n_rays = self.budget.n_rays * self.args.comm.backward_passes_per_step  # the budget is per backward pass
        rays = self.data.sample(n_rays)
        if args.train_background == "random":  # also for opaque scenes: it teaches full opacity
            background = torch.rand((n_rays, 3), generator=self.generator, device=rt.device)
        else:
            background = torch.tensor(BACKGROUNDS.get(args.train_background, (0.0, 0.0, 0.0)), device=rt.device)
            background = background.expand(n_rays, 3)
        jitter = torch.rand(n_rays, generator=self.generator, device=rt.device)
        timer.mark("sampling")
        with out_of_memory_as_error(f"training step (step {step + 1})", self.memory, STEP_HINT):
            res = train_step(self.field, self.grid, self.optimizer, rays, background, self.march, self.loss_fn,
                             jitter, args.precision, self.scaler, self.renderer, timer,
                             args.comm.backward_passes_per_step, self.guard, step + 1,
                             self.data.settings.importance_weights, self.data.loss_scale)
        faultpoints.slow_down(step + 1, res.n_samples)  # test hook, like faultpoints.at_step
        self.budget.update(res)
        if self.state.ema is not None and not res.skipped:  # every rank took this step (or none did)
            self.state.ema.update()
        # the error map (a collective every N steps, on every rank; a skipped step's loss is not recorded)
        self.data.observe(step, rays, None if res.skipped else res.ray_loss, res.valid)
        return res, n_rays

    def end_interval(self, table) -> None:
        """After the monitor's reduction (every rank): epoch, load balance and resolution for the next interval."""
        for note in self.data.end_interval(table):
            dist.log(note)
        balancer = self.data.balancer
        if balancer.mode == "off":
            self.budget.fixed = self.budget.n_rays = balancer.equal_rays or self.budget.n_rays
        else:
            self.budget.target = balancer.target_samples
        if self.renderer is not None:
            # equal rays (off) carry unequal samples: each rank's buffers fit what its rays give
            capacity = balancer.sample_capacity
            factor = float(self.args.model["marching"].get("candidate_factor", 4))
            self.renderer.sample_capacity = capacity
            self.renderer.candidate_capacity = self.budget.candidate_capacity = int(factor * capacity)

    def averaged_weights(self):
        """Context: the field holds its averaged weights (the ``Ema`` block) inside, the raw ones after."""
        return self.state.ema.swapped() if self.state.ema is not None else contextlib.nullcontext()

    def evaluate(self, n_views: int | None = None, save_dir: Path | None = None, n_save: int = 0) -> dict:
        """Test-split metrics with the averaged weights (collective), rendered within the memory budget; its
        peak memory is recorded as the "eval" phase and the cached blocks are released afterwards."""
        with self.averaged_weights(), self.meter.phase("eval"), \
                out_of_memory_as_error("evaluation", self.memory, EVAL_HINT):
            return evaluate(self.field, self.grid, self.scene.test, self.march.schedule, self.march.early_termination,
                            self.args.eval_background, self.args.n_eval_views if n_views is None else n_views,
                            save_dir, n_save, fast=self.backend in FAST_RENDERER_BACKENDS,
                            protocol=self.args.eval_protocol, budget=self.memory)


def run(args: argparse.Namespace) -> RunResult:
    """Train as ``args`` say (every rank calls this); rank 0 prints and writes files."""
    tr = Trainer.build(args)
    rt, scene, field, grid, march, backend, ts = tr.rt, tr.scene, tr.field, tr.grid, tr.march, tr.backend, tr.state
    ckpt_dir = tr.ckpts.directory if checkpointing(args) or tr.stops.signals else None  # a stop always checkpoints
    elastic.startup_agree(lambda: prepare_outputs(args, ckpt_dir), "preparing the output folders")
    source = args.model["_source"]
    out_dir = Path(args.out_dir)
    config = {"args": vars_for_json(args)}

    length = (f"{args.n_steps} steps" + (f" (or {args.time_budget_s:g} s)" if args.time_budget_s else "")
              if args.n_steps < UNLIMITED_STEPS else f"for {args.time_budget_s:g} s")
    dist.log(f"training {length}"
             + f", {args.target_samples} samples/step/rank, grid {grid.resolution}^3 x {grid.n_cascades}, "
               f"dt {march.schedule.dt_min:.5f}..{march.schedule.dt_max:.5f}, cone {march.schedule.cone_angle:.5f}")

    # ts.progress, saved in checkpoints: "history" (one entry per log interval), "curve" (test PSNR/SSIM
    # against training time), "total_samples", "train_seconds" (training time before this process)
    progress = ts.progress
    for key, empty in (("history", []), ("curve", []), ("total_samples", 0.0), ("train_seconds", 0.0)):
        progress.setdefault(key, empty)
    monitor = elastic.startup_agree(lambda: Monitor(MonitorSettings.from_args(args), args.n_steps, tr.start_step,
                                                    memory=tr.meter), "starting the monitor")
    clock = TrainClock(rt.device, already=progress["train_seconds"])
    watchdog = Watchdog(args.watchdog_s, rt.rank).start()
    last_timed_ckpt = [progress["train_seconds"]]  # a shared clock reading: the same on every rank

    def write_checkpoint(step: int) -> Path:
        with watchdog.paused(), clock.paused(), monitor.paused():
            progress["train_seconds"] = clock.shared_seconds()
            progress["data"] = tr.data.state_dict()
            path = tr.ckpts.write(ts, config)
        dist.log(f"[step {step}] checkpoint {path}")
        return path

    stopped: list[str] = []  # set when a stop signal was agreed (preempt)

    def train_loop(commit: Callable[[], None] | None = None) -> None:
        """Steps from ``ts.step`` to the end; re-entered after an elastic reset."""
        eval_at = sorted(t for t in args.eval_at_s if t > progress["train_seconds"])
        tr.budget_lr_factor = budget_lr_factor(progress["train_seconds"], args.time_budget_s, args.budget_lr_decay)
        stats = monitor.new_interval()
        with watchdog.armed():
            while ts.step < args.n_steps:
                res, n_rays = tr.step(ts.step)
                if not res.skipped:
                    stats.add(res.loss, res.mse, n_rays, res.n_samples, res.n_candidates)
                ts.step = step = ts.step + 1
                watchdog.kick(step)
                monitor.tick()
                # a stop signal on any rank (preempt): agreed through this step's non-finite-guard allreduce
                # (or a tiny allreduce every 8 steps), so every rank stops after the same step
                if tr.stops.decide(step, tr.guard) and step < args.n_steps:
                    who = tr.stops.who()
                    dist.log(f"[step {step}] stop requested ({who}): writing a checkpoint, then exiting with status "
                             f"{preempt.EXIT_PREEMPTED} (resume with --resume auto)")
                    path = write_checkpoint(step)
                    dist.agree(lambda: preempt.write_marker(out_dir, step, args.n_steps, who, path),
                               "writing the stop marker")
                    stopped.append(who)
                    break

                if step % args.log_every == 0 or step == args.n_steps:
                    seconds = clock.seconds()
                    r = monitor.end_interval(step, stats, seconds, grid.occupancy_fraction())  # collective; rank 0 prints
                    tr.end_interval(monitor.table)
                    progress["total_samples"] += r["samples"]
                    progress["history"].append({
                        "step": step, "seconds": round(seconds, 3), "loss": r["loss"], "train_psnr": r["train_psnr"],
                        "samples_per_sec": r["samples_per_s"], "rays_per_step": r["rays_per_step"],
                        "step_time_spread": r["step_time_spread"], "gpu_util_spread": r["gpu_util_spread"],
                        **{k: r[k] for k in ("interval_s", "comm_fraction", "gpu_util", "energy_j")}})
                    stats = monitor.new_interval()
                # Evaluation points, the time budget and timed checkpoints, decided from one shared clock
                # reading every 8 steps.
                due = args.eval_every and step % args.eval_every == 0 and step < args.n_steps
                ckpt_due = tr.ckpts.due_by_steps(step)
                stop = False
                if (eval_at or args.time_budget_s or args.ckpt_every_minutes) and step % 8 == 0:
                    elapsed = clock.shared_seconds()
                    due = due or bool(eval_at and elapsed >= eval_at[0])
                    eval_at = [t for t in eval_at if t > elapsed]
                    stop = bool(args.time_budget_s and elapsed >= args.time_budget_s)
                    tr.budget_lr_factor = budget_lr_factor(elapsed, args.time_budget_s, args.budget_lr_decay)
                    if args.ckpt_every_minutes and elapsed - last_timed_ckpt[0] >= 60 * args.ckpt_every_minutes:
                        ckpt_due, last_timed_ckpt[0] = True, elapsed
                if due and not stop:
                    seconds = clock.seconds()
                    with clock.paused(), watchdog.paused(), monitor.paused():
                        ev = tr.evaluate()
                    stats.started += clock.last_pause
                    progress["curve"].append({"step": step, "seconds": round(seconds, 3), "psnr": ev["psnr"],
                                              "ssim": ev["ssim"]})
                    dist.log(f"[step {step}] test PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} "
                             f"views at {seconds:.1f} s")
                if ckpt_due or (stop and checkpointing(args)):
                    write_checkpoint(step)
                    stats.started += clock.last_pause
                if commit is not None:
                    commit()
                if stop:
                    break
        if stats.steps and not stopped:  # the partial interval before a time-budget stop
            progress["total_samples"] += monitor.end_interval(ts.step, stats, clock.seconds(),
                                                              grid.occupancy_fraction())["samples"]

    if dist.elastic():
        elastic.run(train_loop, tr.reseed, ts, args.commit_every)
    else:
        train_loop()
    watchdog.stop()
    monitor.close()
    tr.stops.uninstall()  # the default actions again (an in-process caller keeps its own handlers)
    rt, step = dist.runtime(), ts.step
    if stopped:  # a stop signal: the checkpoint is written; no final evaluation, exit EXIT_PREEMPTED now
        tr.data.close()
        dist.log(f"stopped at step {step} of {args.n_steps} on a signal ({stopped[0]}); checkpoint in "
                 f"{tr.ckpts.directory}; exit status {preempt.EXIT_PREEMPTED}")
        return RunResult(field, grid, step, {"steps": step, "stopped": stopped[0]}, stopped[0])
    train_seconds = progress["train_seconds"] = clock.seconds()
    if checkpointing(args) and step not in [s for s, _ in tr.ckpts.existing()]:
        write_checkpoint(step)  # a restartable run always ends with a checkpoint
    stream = tr.data.stream_report()
    tr.data.close()
    if stream:
        dist.log(stream)

    ev = tr.evaluate(save_dir=out_dir / "renders", n_save=args.save_renders)
    progress["curve"].append({"step": step, "seconds": round(train_seconds, 3), "psnr": ev["psnr"], "ssim": ev["ssim"]})
    samples_per_sec = progress["total_samples"] / max(train_seconds, 1e-9)
    dist.log(f"done: {step} steps in {train_seconds:.1f} s, {samples_per_sec / 1e6:.3f} M samples/s, "
             f"test PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} views")
    if args.save_snapshot:
        checkpoint.save(ts, args.save_snapshot, config)
    metrics = {"world_size": rt.size, "steps": step, "train_seconds": round(train_seconds, 3),
               "samples_per_sec": samples_per_sec, "test_psnr": ev["psnr"], "test_ssim": ev["ssim"],
               "test_views": ev["views"], "psnr_per_view": ev.get("psnr_per_view", []), "curve": progress["curve"],
               "device": device_name(rt.device), "backend": backend, "precision": args.precision,
               "controller": rt.controller, "scene": scene.source, "config": source,
               "nonfinite_skipped_steps": tr.guard.skipped if tr.guard else None, "history": progress["history"],
               "communication": args.comm.summary(os.environ, tr.lr_multiplier()), "data": tr.data.summary(),
               "memory": {"budget_gib": None if tr.memory.bytes is None else round(tr.memory.bytes / GIB, 3),
                          "budget_source": tr.memory.source, "peak": tr.meter.summary()}}
    if rt.is_root:
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
        if args.metrics_json:
            Path(args.metrics_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.metrics_json).write_text(json.dumps(metrics, indent=1))
    return RunResult(field, grid, step, metrics)


BUDGET_LR_MILESTONES = (0.5, 0.75, 0.9)  # fractions of --time_budget_s (nerfacc's step schedule, on time)
BUDGET_LR_GAMMA = 0.33


def budget_lr_factor(elapsed_s: float, budget_s: float, mode: str = "on") -> float:
    """Learning-rate factor after ``elapsed_s`` seconds of a ``budget_s`` training budget (1 without one).

    Every rank passes the same shared clock reading, so every rank applies the same factor."""
    if mode != "on" or not budget_s:
        return 1.0
    return BUDGET_LR_GAMMA ** sum(elapsed_s >= m * budget_s for m in BUDGET_LR_MILESTONES)


def checkpointing(args: argparse.Namespace) -> bool:
    """Periodic checkpoints are on (then a run also ends, or stops on its time budget, with one)."""
    return args.ckpt_every > 0 or args.ckpt_every_minutes > 0


def prepare_outputs(args: argparse.Namespace, ckpt_dir: Path | None) -> None:
    """Rank 0: create the output folders and prove they are writable now, not after hours of training."""
    if not dist.runtime().is_root:
        return
    folders = [("output folder (--out_dir)", Path(args.out_dir))]
    if ckpt_dir is not None:
        folders.append(("checkpoint folder (--ckpt_dir)", ckpt_dir))
    for option in ("save_snapshot", "metrics_json"):
        if getattr(args, option):
            folders.append((f"folder of --{option}", Path(getattr(args, option)).parent))
    for what, folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise ConfigError(f"{folder}: cannot write to the {what}: {exc.strerror}") from None
    preempt.clear_marker(Path(args.out_dir))  # a previous stop's marker: this run decides anew


def vars_for_json(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, dict, list, type(None)))}


def cli(argv: list[str] | None = None) -> None:
    """Console-script wrapper: any failure becomes one clear message naming the rank, and a fast non-zero exit.

    User errors exit 2; unexpected exceptions 1 (see ``failures.report``).
    """
    run_cli(main, argv, report=report)


if __name__ == "__main__":
    cli()
