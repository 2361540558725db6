"""Entry point: ``python -m hvd_ngp.train`` (size 1) or under ``horovodrun``/``mpirun`` (N ranks).

The loop, every rank, every step: occupancy update (every ``update_interval`` steps, collective) ->
sample this rank's rays -> march + render -> loss -> backward -> Horovod allreduce inside
``optimizer.step()``. Metrics are reduced once per log interval; rank 0 prints and writes files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from . import dist
from .checkpoint import read_snapshot, restore_snapshot, save_snapshot
from .comm import CommSettings
from .config import CPU_CONFIG, BASE_CONFIG, parse_args
from .data import Scene, load_scene
from .data.pipeline import DataPipeline
from .data.sampler import RayBatch, RaySampler
from .encoding import resolve_backend
from .errors import ConfigError, run_cli
from .field import NGPField
from .clock import TrainClock
from .evaluate import BACKGROUNDS, composite_background, evaluate
from .hvdtools import apply as apply_horovod_tools
from .monitor import Monitor, MonitorSettings
from .occupancy import OccupancyGrid, n_cascades_for
from .profiling import NULL_TIMER, StageTimer

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


def unwrap_adam(block: dict, source: str) -> tuple[dict, dict | None]:
    """instant-ngp optimizer chain -> (Adam settings, ExponentialDecay settings or None). Ema is ignored."""
    decay = None
    while block.get("otype") in ("Ema", "ExponentialDecay"):
        if block["otype"] == "ExponentialDecay":
            decay = block
        block = block.get("nested", {})
    if block.get("otype") != "Adam":
        raise ConfigError(f"{source}: optimizer must be Adam (optionally inside ExponentialDecay/Ema), got {block.get('otype')!r}")
    return block, decay


def make_optimizer(field: NGPField, block: dict, source: str) -> tuple[torch.optim.Adam, callable]:
    """Adam (L2 on the MLP weights only) and ``lr_at(step)`` for the ExponentialDecay schedule."""
    adam, decay = unwrap_adam(block, source)
    lr = float(adam.get("learning_rate", 1e-2))
    opt = torch.optim.Adam(
        [{"params": field.encoding_parameters(), "weight_decay": 0.0},
         {"params": field.mlp_parameters(), "weight_decay": float(adam.get("l2_reg", 1e-6))}],
        lr=lr, betas=(float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.99))),
        eps=float(adam.get("epsilon", 1e-15)))

    def lr_at(step: int) -> float:
        if decay is None or step < int(decay.get("decay_start", 0)):
            return lr
        k = (step - int(decay.get("decay_start", 0))) // max(int(decay.get("decay_interval", 1)), 1)
        return lr * float(decay.get("decay_base", 0.33)) ** k

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
    """loss, mse: device scalars (importance-weighted means); n_samples (through the network), n_candidates
    (marched): ints on the reference path, device scalars on the fast path (read them without blocking: see
    ``RayBudget``); ray_loss ``[R]`` each ray's unweighted loss (detached), valid ``[R]`` or None (all)."""

    loss: Tensor
    mse: Tensor
    n_samples: int | Tensor
    n_candidates: int | Tensor
    n_valid: int | Tensor
    ray_loss: Tensor | None = None
    valid: Tensor | None = None


AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def train_step(field: NGPField, grid: OccupancyGrid, optimizer: torch.optim.Optimizer, rays: RayBatch,
               background: Tensor, march: Marching, loss_fn, jitter: Tensor | None, precision: str = "fp32",
               scaler: torch.amp.GradScaler | None = None, renderer: FastRenderer | None = None,
               timer: StageTimer = NULL_TIMER, backward_passes: int = 1, weight_gradient: bool = True,
               loss_scale: float = 1.0) -> StepResult:
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
    pattern: synchronize (allreduce), unscale, then step without a second synchronisation.
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
        part_loss = masked_mean(per_channel, valid, weight) * share
        trained = part_loss if weight_gradient or weight is None else masked_mean(per_channel, valid) * share
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
    distributed = hasattr(optimizer, "synchronize")  # Horovod DistributedOptimizer
    if distributed:
        optimizer.synchronize()  # waits for the gradient allreduce started during backward
        timer.mark("allreduce")
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
    return StepResult(loss, mse, n_samples, n_candidates, n_valid, torch.cat(ray_loss) if ray_loss else None, all_valid)


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, default_config=BASE_CONFIG if torch.cuda.is_available() else CPU_CONFIG)
    run(args)
    return 0


@dataclass
class Trainer:
    """Everything one rank's training steps need, built by ``Trainer.build`` (collective)."""

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
    data: DataPipeline
    renderer: "FastRenderer | None"
    budget: RayBudget
    generator: torch.Generator  # backgrounds and jitter, seeded by global rank
    start_step: int = 0
    lr_scale: float = 1.0  # the learning-rate rule for this many ranks (comm.CommSettings.lr_multiplier)

    @staticmethod
    def build(args: argparse.Namespace) -> "Trainer":
        comm: CommSettings = args.comm
        apply_horovod_tools(args)  # timeline/autotune/stall-check variables must precede Horovod's init
        rt = dist.init(args.device, args.threads, env=comm.init_env(os.environ, dist.wants_cuda(args.device)))
        use_cuda = rt.device.type == "cuda"
        notes = comm.check_runtime(rt.size, rt.local_size, rt.controller, use_cuda, os.environ)
        dist.agree(lambda: comm.block.check_host(rt.is_root), "checking the distributed block")
        torch.manual_seed(args.seed)  # identical model init everywhere (and broadcast from rank 0 anyway)
        source = args.model["_source"]
        backend = resolve_backend(args.backend, rt.device)
        dist.log(f"hvd_ngp: {rt.size} rank(s) [{rt.controller}], device {device_name(rt.device)}, "
                 f"config {source}, backend {backend}, host {socket.gethostname()}")
        lr_scale = comm.lr_multiplier(rt.size, rt.local_size, use_cuda)
        if rt.size > 1 or comm.backward_passes_per_step > 1:
            dist.log(comm.describe(os.environ, lr_scale, rt.cross_size, notes))
        scene: Scene = dist.agree(lambda: load_scene(
            args.scene, scene_cache=args.scene_cache, builtin_seed=args.builtin_seed, train_split=args.train_split,
            test_split=args.test_split, holdout_every=args.holdout_every, downscale=args.downscale,
            sharpness_threshold=args.sharpness_threshold, lazy_train=True),
            "loading the scene")
        dist.log(f"scene {scene.source}: {len(scene.train)} train / {len(scene.test)} test views, "
                 f"{scene.train.width}x{scene.train.height}, aabb_scale {scene.aabb_scale}"
                 + (f", {scene.skipped_frames} frame(s) skipped: image missing" if scene.skipped_frames else ""))

        data = DataPipeline.build(scene.train, args, rt, args.scene_cache)
        dist.log(data.describe())
        model = args.model
        field = NGPField(model, scene.aabb, backend).to(rt.device)
        grid = make_grid(model["marching"], scene).to(rt.device)
        march = Marching.from_config(model["marching"], scene.aabb_scale, source)
        seen = grid.mark_unseen(scene.train.c2w, scene.train.intrinsics, scene.train.sizes, march.schedule.near)
        dist.log(f"occupancy grid: {100 * seen:.1f}% of the cells are seen by a training camera")
        optimizer, lr_at = make_optimizer(field, model["optimizer"], source)
        start_step = 0
        if args.load_snapshot:
            def load() -> int:
                if not rt.is_root:
                    return 0
                return restore_snapshot(read_snapshot(args.load_snapshot, rt.device), field, grid, optimizer,
                                        args.load_snapshot)
            start_step = dist.broadcast_object(dist.agree(load, "loading the snapshot"), name="snapshot.step")
            dist.broadcast_(grid.density, name="snapshot.grid")
            grid.refresh_occupied()
            dist.broadcast_state(field, optimizer)  # optimizer state first, then parameters (see dist)
        else:
            dist.broadcast_state(field)
        optimizer = dist.distributed_optimizer(optimizer, field.named_parameters(), comm.compression,
                                               comm.backward_passes_per_step, comm.reduce_op)

        renderer = None
        if backend == "triton":
            from .render.fast import FastRenderer

            renderer = FastRenderer(int(model["marching"].get("candidate_factor", 4) * args.target_samples),
                                    args.target_samples)
        generator = torch.Generator(device=rt.device)
        generator.manual_seed(args.seed * 7919 + rt.rank)
        return Trainer(args, rt, backend, scene, field, grid, march, optimizer, lr_at, make_loss(model["loss"], source),
                       make_scaler(args.precision, comm, rt.device, rt.size), data, renderer,
                       RayBudget(args.n_rays_init, args.target_samples, args.max_rays,
                                 renderer.candidate_capacity if renderer else None),
                       generator, start_step, lr_scale)

    def step(self, step: int, timer: StageTimer = NULL_TIMER) -> tuple[StepResult, int]:
        """Training step number ``step`` (collective): occupancy refresh when due, rays, render, update.
        Returns the result and the number of rays it used."""
        args, rt = self.args, self.rt
        timer.start()
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step) * self.lr_scale
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
        res = train_step(self.field, self.grid, self.optimizer, rays, background, self.march, self.loss_fn, jitter,
                         args.precision, self.scaler, self.renderer, timer, args.comm.backward_passes_per_step,
                         self.data.settings.importance_weights, self.data.loss_scale)
        self.budget.update(res)
        self.data.observe(step, rays, res.ray_loss, res.valid)  # the error map (a collective every N steps)
        return res, n_rays

    @property
    def sampler(self) -> RaySampler:
        return self.data.sampler

    def end_interval(self, table) -> None:
        """After the monitor's reduction (every rank): epoch, load balance and resolution for the next interval."""
        for note in self.data.end_interval(table):
            dist.log(note)
        balancer = self.data.balancer
        if balancer.mode == "off":
            self.budget.fixed = self.budget.n_rays = balancer.equal_rays or self.budget.n_rays
            return
        target = balancer.target_samples
        self.budget.target = target
        if self.renderer is not None:
            factor = float(self.args.model["marching"].get("candidate_factor", 4))
            self.renderer.sample_capacity = target
            self.renderer.candidate_capacity = self.budget.candidate_capacity = int(factor * target)

    def evaluate(self, n_views: int | None = None, save_dir: Path | None = None, n_save: int = 0) -> dict:
        """Test-split metrics (collective)."""
        return evaluate(self.field, self.grid, self.scene.test, self.march.schedule, self.march.early_termination,
                        self.args.eval_background, self.args.n_eval_views if n_views is None else n_views, save_dir,
                        n_save, fast=self.backend == "triton")


def run(args: argparse.Namespace) -> RunResult:
    """Train as ``args`` say (every rank calls this); rank 0 prints and writes files."""
    tr = Trainer.build(args)
    rt, scene, field, grid, march, backend = tr.rt, tr.scene, tr.field, tr.grid, tr.march, tr.backend
    source = args.model["_source"]
    out_dir = Path(args.out_dir)
    if rt.is_root:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{out_dir}: cannot create the output folder: {exc.strerror}") from None

    dist.log(f"training {args.n_steps} steps" + (f" (or {args.time_budget_s:g} s)" if args.time_budget_s else "")
             + f", {args.target_samples} samples/step/rank, grid {grid.resolution}^3 x {grid.n_cascades}, "
               f"dt {march.schedule.dt_min:.5f}..{march.schedule.dt_max:.5f}, cone {march.schedule.cone_angle:.5f}")

    history: list[dict] = []   # one entry per log interval
    curve: list[dict] = []     # test PSNR/SSIM against training time
    eval_at = sorted(args.eval_at_s)
    monitor = dist.agree(lambda: Monitor(MonitorSettings.from_args(args), args.n_steps, tr.start_step),
                         "starting the monitor")
    stats = monitor.new_interval()
    total_samples = 0.0
    clock = TrainClock(rt.device)
    step = tr.start_step
    while step < args.n_steps:
        res, n_rays = tr.step(step)
        stats.add(res.loss, res.mse, n_rays, res.n_samples, res.n_candidates)
        step += 1
        monitor.tick()

        if step % args.log_every == 0 or step == args.n_steps:
            seconds = clock.seconds()
            r = monitor.end_interval(step, stats, seconds, grid.occupancy_fraction())  # one collective; rank 0 prints
            tr.end_interval(monitor.table)
            total_samples += r["samples"]
            history.append({"step": step, "seconds": round(seconds, 3), "loss": r["loss"],
                            "train_psnr": r["train_psnr"], "samples_per_sec": r["samples_per_s"],
                            "rays_per_step": r["rays_per_step"], "step_time_spread": r["step_time_spread"],
                            "gpu_util_spread": r["gpu_util_spread"],
                            **{k: r[k] for k in ("interval_s", "comm_fraction", "gpu_util", "energy_j")}})
            stats = monitor.new_interval()
        # Evaluation points and the time budget, decided from one shared clock reading every 8 steps.
        due = args.eval_every and step % args.eval_every == 0 and step < args.n_steps
        if (eval_at or args.time_budget_s) and step % 8 == 0:
            elapsed = clock.shared_seconds()
            due = due or bool(eval_at and elapsed >= eval_at[0])
            eval_at = [t for t in eval_at if t > elapsed]
            stop = bool(args.time_budget_s and elapsed >= args.time_budget_s)
        else:
            stop = False
        if due and not stop:
            seconds = clock.seconds()
            with clock.paused(), monitor.paused():
                ev = tr.evaluate()
            stats.started += clock.last_pause
            curve.append({"step": step, "seconds": round(seconds, 3), "psnr": ev["psnr"], "ssim": ev["ssim"]})
            dist.log(f"[step {step}] test PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} views "
                     f"at {seconds:.1f} s")
        if stop:
            break
    train_seconds = clock.seconds()
    if stats.steps:  # the partial interval before a time-budget stop
        total_samples += monitor.end_interval(step, stats, train_seconds, grid.occupancy_fraction())["samples"]
    monitor.close()
    stream = tr.data.stream_report()
    tr.data.close()
    if stream:
        dist.log(stream)

    ev = tr.evaluate(save_dir=out_dir / "renders", n_save=args.save_renders)
    curve.append({"step": step, "seconds": round(train_seconds, 3), "psnr": ev["psnr"], "ssim": ev["ssim"]})
    samples_per_sec = total_samples / max(train_seconds, 1e-9)
    dist.log(f"done: {step} steps in {train_seconds:.1f} s, {samples_per_sec / 1e6:.3f} M samples/s, "
             f"test PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['views']} views")
    if args.save_snapshot:
        if rt.is_root:  # a DistributedOptimizer's state_dict is the wrapped optimizer's
            save_snapshot(args.save_snapshot, field, grid, tr.optimizer, step, {"args": vars_for_json(args)})
        dist.barrier()
    metrics = {"world_size": rt.size, "steps": step, "train_seconds": round(train_seconds, 3),
               "samples_per_sec": samples_per_sec, "test_psnr": ev["psnr"], "test_ssim": ev["ssim"],
               "test_views": ev["views"], "psnr_per_view": ev.get("psnr_per_view", []), "curve": curve,
               "device": device_name(rt.device), "backend": backend, "precision": args.precision,
               "controller": rt.controller, "scene": scene.source, "config": source, "history": history,
               "communication": args.comm.summary(os.environ, tr.lr_scale), "data": tr.data.summary()}
    if rt.is_root:
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
        if args.metrics_json:
            Path(args.metrics_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.metrics_json).write_text(json.dumps(metrics, indent=1))
    return RunResult(field, grid, step, metrics)


def vars_for_json(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, dict, list, type(None)))}


def cli(argv: list[str] | None = None) -> None:
    """Console-script wrapper: user errors become one line on stderr and exit status 2."""
    run_cli(main, argv)


if __name__ == "__main__":
    cli()
