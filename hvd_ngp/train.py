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
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from . import dist
from .checkpoint import read_snapshot, restore_snapshot, save_snapshot
from .comm import CommSettings
from .config import CPU_CONFIG, BASE_CONFIG, parse_args
from .data import Frames, Scene, load_scene
from .data.sampler import RayBatch, RaySampler, image_rays
from .encoding import resolve_backend
from .errors import ConfigError, run_cli
from .field import NGPField
from .metrics import IntervalStats, mse_to_psnr
from .occupancy import OccupancyGrid, n_cascades_for
from .render import render_image, render_rays


# ------------------------------------------------------------------------------------ recipe


@dataclass(frozen=True)
class Marching:
    """Ray-marching constants derived from the ``marching`` block and the scene bounds."""

    dt: float
    n_steps: int
    early_termination: float
    update_interval: int
    warmup_steps: int

    @staticmethod
    def from_config(block: dict, aabb: Tensor) -> "Marching":
        diag = float((aabb[1] - aabb[0]).norm())
        steps = int(block["steps_per_diagonal"])
        if steps <= 0:
            raise ConfigError(f"marching.steps_per_diagonal must be positive, got {steps}")
        # dt is set by the unit cube (like instant-ngp); larger scenes take proportionally more steps.
        dt = math.sqrt(3.0) / steps
        return Marching(dt, int(math.ceil(diag / dt)) + 1, float(block["early_termination"]),
                        int(block["update_interval"]), int(block["warmup_steps"]))


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
    otype = block.get("otype", "L2")
    if otype == "L2":
        return lambda pred, target: F.mse_loss(pred, target)
    if otype == "Huber":
        delta = float(block.get("delta", 0.1))
        return lambda pred, target: F.huber_loss(pred, target, delta=delta) / delta
    if otype == "L1":
        return lambda pred, target: F.l1_loss(pred, target)
    raise ConfigError(f"{source}: loss.otype {otype!r} is unknown (L2, Huber, L1)")


BACKGROUNDS = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}


def composite_background(rgba: Tensor, background: Tensor) -> Tensor:
    """RGBA ``[R, 4]`` over background ``[R, 3]`` or ``[3]`` -> RGB ``[R, 3]``."""
    return rgba[:, :3] * rgba[:, 3:4] + background * (1.0 - rgba[:, 3:4])


# ------------------------------------------------------------------------------------ one step


@dataclass
class StepResult:
    loss: Tensor
    mse: Tensor
    n_samples: int
    n_candidates: int


AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def train_step(field: NGPField, grid: OccupancyGrid, optimizer: torch.optim.Optimizer, rays: RayBatch,
               background: Tensor, march: Marching, loss_fn, jitter: Tensor | None, precision: str = "fp32",
               scaler: torch.amp.GradScaler | None = None, backward_passes: int = 1) -> StepResult:
    """Render ``rays``, compare with their pixels on ``background`` ``[R, 3]``, and take one optimizer step.

    ``backward_passes`` > 1 splits the rays into that many chunks with one backward pass each
    (gradient accumulation; each chunk's loss is weighted by its share of the rays, so the summed
    gradient is the one of the whole batch). Every rank calls this every step, even with no samples:
    the allreduce inside ``optimizer.step()`` must see every rank. With a gradient scaler (fp16
    autocast or fp16 compression), Horovod's pattern: synchronize (allreduce), unscale, then step
    without a second synchronisation.
    """
    device_type = rays.origins.device.type
    target = composite_background(rays.rgba, background)
    n = len(rays)
    bounds = [round(i * n / backward_passes) for i in range(backward_passes + 1)]
    loss_sum, mse_sum = torch.zeros((), device=rays.origins.device), torch.zeros((), device=rays.origins.device)
    n_samples = n_candidates = 0
    optimizer.zero_grad()
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a == b:
            continue
        part = slice(a, b)
        with torch.autocast(device_type, dtype=AUTOCAST.get(precision, torch.float32), enabled=precision in AUTOCAST):
            out = render_rays(field, lambda x: field.query_density(x)[0], rays.origins[part], rays.directions[part],
                              field.aabb, grid, march.dt, march.n_steps, march.early_termination,
                              None if jitter is None else jitter[part])
        pred = out.rgb.float() + background[part] * (1.0 - out.opacity.float()[:, None])
        share = (b - a) / n
        loss = loss_fn(pred, target[part]) * share
        (loss if scaler is None else scaler.scale(loss)).backward()
        loss_sum += loss.detach()
        mse_sum += F.mse_loss(pred.detach(), target[part]) * share
        n_samples += out.n_samples
        n_candidates += out.n_candidates
    if scaler is None:
        optimizer.step()
    else:
        if hasattr(optimizer, "synchronize"):  # Horovod DistributedOptimizer
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)
        scaler.update()
    return StepResult(loss_sum, mse_sum, n_samples, n_candidates)


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


# ------------------------------------------------------------------------------------ evaluation


def evaluate(field: NGPField, grid: OccupancyGrid, frames: Frames, march: Marching, background: str,
             n_views: int = 0, save_dir: Path | None = None, n_save: int = 0) -> dict:
    """PSNR over the test views; every rank renders its share (collective). Rank 0 writes PNGs."""
    rt = dist.runtime()
    n = len(frames) if n_views <= 0 else min(n_views, len(frames))
    if n == 0:
        return {"psnr": float("nan"), "views": 0}
    bg = torch.tensor(BACKGROUNDS[background], device=rt.device)
    mse = torch.zeros(n, dtype=torch.float64)
    keep: list[tuple[int, np.ndarray]] = []
    field.eval()
    for i in range(rt.rank, n, rt.size):
        o, d = image_rays(frames, i, rt.device)
        rgb, _ = render_image(field, lambda x: field.query_density(x)[0], o, d, field.aabb, grid, march.dt,
                              march.n_steps, bg, march.early_termination)
        gt = composite_background(frames.images[i].to(rt.device).view(-1, 4).float() / 255.0, bg)
        mse[i] = float(torch.mean((rgb.clamp(0, 1) - gt) ** 2))
        if i < n_save:
            keep.append((i, (rgb.clamp(0, 1).view(frames.height, frames.width, 3) * 255 + 0.5).byte().cpu().numpy()))
    field.train()
    mse = dist.allreduce(mse, "sum", name="eval.mse")
    gathered = dist.allgather_object(keep, name="eval.images") if n_save > 0 else []
    if rt.is_root and save_dir is not None:
        import cv2

        save_dir.mkdir(parents=True, exist_ok=True)
        for per_rank in gathered:
            for i, img in per_rank:
                cv2.imwrite(str(save_dir / f"test_{i:03d}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    psnrs = [mse_to_psnr(float(m)) for m in mse]
    return {"psnr": float(np.mean(psnrs)), "views": n, "psnr_per_view": [round(p, 3) for p in psnrs]}


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


def run(args: argparse.Namespace) -> RunResult:
    """Train as ``args`` say (every rank calls this); rank 0 prints and writes files."""
    comm: CommSettings = args.comm
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

    scene: Scene = dist.agree(lambda: load_scene(args.scene, scene_cache=args.scene_cache, builtin_seed=args.builtin_seed,
                                                 train_split=args.train_split, test_split=args.test_split,
                                                 holdout_every=args.holdout_every, downscale=args.downscale),
                              "loading the scene")
    dist.log(f"scene {scene.source}: {len(scene.train)} train / {len(scene.test)} test views, "
             f"{scene.train.width}x{scene.train.height}, aabb_scale {scene.aabb_scale}"
             + (f", {scene.skipped_frames} frame(s) skipped: image missing" if scene.skipped_frames else ""))

    model = args.model
    field = NGPField(model, scene.aabb, backend).to(rt.device)
    grid = make_grid(model["marching"], scene).to(rt.device)
    march = Marching.from_config(model["marching"], scene.aabb)
    optimizer, lr_at = make_optimizer(field, model["optimizer"], source)
    loss_fn = make_loss(model["loss"], source)

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

    scaler = make_scaler(args.precision, comm, rt.device, rt.size)
    sampler = RaySampler(scene.train, rt.rank, rt.size, args.seed, rt.device)
    bg_gen = torch.Generator(device=rt.device)
    bg_gen.manual_seed(args.seed * 7919 + rt.rank)
    n_rays = args.n_rays_init
    out_dir = Path(args.out_dir)
    if rt.is_root:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{out_dir}: cannot create the output folder: {exc.strerror}") from None

    dist.log(f"training {args.n_steps} steps" + (f" (or {args.time_budget_s:g} s)" if args.time_budget_s else "")
             + f", {args.target_samples} samples/step/rank, grid {grid.resolution}^3 x {grid.n_cascades}, "
               f"{march.n_steps} steps/ray max")
    history: list[dict] = []
    stats = IntervalStats()
    total_samples = 0.0
    train_seconds = 0.0
    t_start = time.perf_counter()
    step = start_step
    while step < args.n_steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step) * lr_scale
        if step % march.update_interval == 0:
            grid.update(lambda x: field.query_density(x)[0], march.dt, step, march.warmup_steps, args.seed)
        rays = sampler.sample(n_rays * comm.backward_passes_per_step)
        if scene.has_alpha and args.train_background == "random":
            background = torch.rand((len(rays), 3), generator=bg_gen, device=rt.device)
        else:
            background = torch.tensor(BACKGROUNDS.get(args.train_background, (0.0, 0.0, 0.0)), device=rt.device)
            background = background.expand(len(rays), 3)
        jitter = torch.rand(len(rays), generator=bg_gen, device=rt.device)
        res = train_step(field, grid, optimizer, rays, background, march, loss_fn, jitter, args.precision, scaler,
                         comm.backward_passes_per_step)
        stats.add(res.loss, res.mse, len(rays), res.n_samples, res.n_candidates)
        # Adapt the ray count so the next step carries about target_samples samples (instant-ngp's rule).
        per_ray = max(res.n_samples, 1) / len(rays)
        n_rays = int(min(max(args.target_samples / per_ray, 64), args.max_rays)) // 64 * 64
        step += 1

        if step % args.log_every == 0 or step == args.n_steps:
            if rt.device.type == "cuda":
                torch.cuda.synchronize()
            r = stats.reduce(rt.device)
            train_seconds += r["seconds"]
            total_samples += r["samples"]
            line = (f"[step {step}] {r['samples'] / max(r['seconds'], 1e-9) / 1e6:.3f} M samples/s | "
                    f"{r['rays_per_step']:.0f} rays/step | loss {r['loss']:.5f} | train PSNR {mse_to_psnr(r['mse']):.2f} | "
                    f"occupied {100 * grid.occupancy_fraction():.1f}% | {train_seconds:.1f} s")
            dist.log(line)
            history.append({"step": step, "seconds": round(train_seconds, 3), "loss": r["loss"],
                            "train_psnr": mse_to_psnr(r["mse"]), "samples_per_sec": r["samples"] / max(r["seconds"], 1e-9)})
            if args.eval_every and step % args.eval_every == 0 and step < args.n_steps:
                ev = evaluate(field, grid, scene.test, march, args.eval_background, args.n_eval_views)
                dist.log(f"[step {step}] test PSNR {ev['psnr']:.2f} dB over {ev['views']} views")
                history[-1]["test_psnr"] = ev["psnr"]
            stats = IntervalStats()
        if args.time_budget_s and step % 8 == 0:
            over = torch.tensor([1.0 if (rt.is_root and time.perf_counter() - t_start > args.time_budget_s) else 0.0])
            if float(dist.allreduce(over, "max", name="time_budget")[0]) > 0:
                break
    if stats.steps:  # the partial interval before a time-budget stop
        r = stats.reduce(rt.device)
        train_seconds += r["seconds"]
        total_samples += r["samples"]

    ev = evaluate(field, grid, scene.test, march, args.eval_background, args.n_eval_views,
                  out_dir / "renders", args.save_renders)
    samples_per_sec = total_samples / max(train_seconds, 1e-9)
    dist.log(f"done: {step} steps in {train_seconds:.1f} s, {samples_per_sec / 1e6:.3f} M samples/s, "
             f"test PSNR {ev['psnr']:.2f} dB over {ev['views']} views")
    if args.save_snapshot:
        inner = optimizer  # DistributedOptimizer is a subclass of the wrapped optimizer: its state_dict is the same
        if rt.is_root:
            save_snapshot(args.save_snapshot, field, grid, inner, step, {"args": vars_for_json(args)})
        dist.barrier()
    metrics = {"world_size": rt.size, "steps": step, "train_seconds": round(train_seconds, 3),
               "samples_per_sec": samples_per_sec, "test_psnr": ev["psnr"], "test_views": ev["views"],
               "psnr_per_view": ev.get("psnr_per_view", []), "device": device_name(rt.device), "backend": backend,
               "precision": args.precision, "controller": rt.controller, "scene": scene.source, "config": source,
               "communication": comm.summary(os.environ, lr_scale),
               "history": history}
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
