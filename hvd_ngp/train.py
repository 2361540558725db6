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
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from . import checkpoint, dist, elastic, faults
from .checkpoint import CheckpointManager, resume
from .control import RunClock
from .config import CPU_CONFIG, BASE_CONFIG, parse_args
from .data import Frames, Scene, load_scene
from .data.sampler import RayBatch, image_rays
from .encoding import resolve_backend
from .elastic import lr_scale
from .errors import ConfigError
from .failures import NonFiniteGuard, Watchdog, report
from .field import NGPField
from .metrics import IntervalStats, mse_to_psnr
from .occupancy import OccupancyGrid, n_cascades_for
from .render import render_image, render_rays
from .trainstate import TrainState, make_rank_streams


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
    skipped: bool = False  # a non-finite loss or gradients somewhere: no rank took the optimizer step


AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def train_step(field: NGPField, grid: OccupancyGrid, optimizer: torch.optim.Optimizer, rays: RayBatch,
               background: Tensor, march: Marching, loss_fn, jitter: Tensor | None, precision: str = "fp32",
               scaler: torch.amp.GradScaler | None = None, guard: NonFiniteGuard | None = None,
               step: int = 0) -> StepResult:
    """Render ``rays``, compare with their pixels on ``background`` ``[R, 3]``, and take one optimizer step.

    Every rank calls this every step, even with no samples: the gradient allreduce must see every
    rank. Horovod's pattern: synchronize (allreduce), then (unscale with fp16 and) step without a
    second synchronisation. With a ``guard``, every rank skips the step when the loss or the reduced
    gradients are non-finite on any rank (``step`` is the 1-based step number, for messages).
    """
    device_type = rays.origins.device.type
    with torch.autocast(device_type, dtype=AUTOCAST.get(precision, torch.float32), enabled=precision in AUTOCAST):
        out = render_rays(field, lambda x: field.query_density(x)[0], rays.origins, rays.directions, field.aabb,
                          grid, march.dt, march.n_steps, march.early_termination, jitter)
    pred = out.rgb.float() + background * (1.0 - out.opacity.float()[:, None])
    target = composite_background(rays.rgba, background)
    loss = faults.poison_loss(loss_fn(pred, target), step)  # identity unless a test arms HVD_NGP_FAULTS
    if guard is not None:
        guard.submit(loss)
    optimizer.zero_grad()
    (loss if scaler is None else scaler.scale(loss)).backward()
    distributed = hasattr(optimizer, "synchronize")  # Horovod DistributedOptimizer
    if distributed:
        optimizer.synchronize()
    skipped = guard is not None and guard.should_skip(optimizer, step, check_gradients=scaler is None)
    if not skipped:
        if scaler is not None:
            scaler.unscale_(optimizer)
        with optimizer.skip_synchronize() if distributed else contextlib.nullcontext():
            (optimizer.step() if scaler is None else scaler.step(optimizer))
        if scaler is not None:
            scaler.update()
    return StepResult(loss.detach(), F.mse_loss(pred.detach(), target), out.n_samples, out.n_candidates, skipped)


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
    try:
        args = parse_args(argv, default_config=BASE_CONFIG if torch.cuda.is_available() else CPU_CONFIG)
    except ConfigError as exc:
        report_on_every_rank(exc, "reading the configuration")
    run(args)
    return 0


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


def run(args: argparse.Namespace) -> RunResult:
    """Train as ``args`` say (every rank calls this); rank 0 prints and writes files."""
    rt = dist.init(args.device, args.threads)
    torch.manual_seed(args.seed)  # identical model init everywhere (and broadcast from rank 0 anyway)
    source = args.model["_source"]
    backend = resolve_backend(args.backend, rt.device)
    dist.log(f"hvd_ngp: {rt.size} rank(s) [{rt.controller}{', elastic' if dist.elastic() else ''}], "
             f"device {device_name(rt.device)}, config {source}, backend {backend}, host {socket.gethostname()}")

    scene: Scene = elastic.startup_agree(
        lambda: load_scene(args.scene, scene_cache=args.scene_cache, builtin_seed=args.builtin_seed,
                           train_split=args.train_split, test_split=args.test_split,
                           holdout_every=args.holdout_every, downscale=args.downscale), "loading the scene")
    dist.log(f"scene {scene.source}: {len(scene.train)} train / {len(scene.test)} test views, "
             f"{scene.train.width}x{scene.train.height}, aabb_scale {scene.aabb_scale}"
             + (f", {scene.skipped_frames} frame(s) skipped: image missing" if scene.skipped_frames else ""))

    def build() -> tuple:
        model = args.model
        field = NGPField(model, scene.aabb, backend).to(rt.device)
        optimizer, lr_at = make_optimizer(field, model["optimizer"], source)
        return (field, make_grid(model["marching"], scene).to(rt.device), Marching.from_config(model["marching"], scene.aabb),
                optimizer, lr_at, make_loss(model["loss"], source))

    field, grid, march, optimizer, lr_at, loss_fn = elastic.startup_agree(build, "building the model")
    optimizer = dist.distributed_optimizer(optimizer, field.named_parameters())  # before any state is loaded into it
    scaler = torch.amp.GradScaler(rt.device.type) if args.precision == "fp16" else None
    ts = TrainState(field, grid, optimizer, scaler, *make_rank_streams(scene.train, args.seed, rt.rank, rt.size, rt.device),
                    n_rays=args.n_rays_init)

    out_dir = Path(args.out_dir)
    ckpts = CheckpointManager(args.ckpt_dir or out_dir / "checkpoints", args.ckpt_every, args.ckpt_keep)
    checkpointing = args.ckpt_every > 0 or args.ckpt_every_minutes > 0
    elastic.startup_agree(lambda: prepare_outputs(args, out_dir, ckpts.directory if checkpointing else None),
                          "preparing the output folders")
    def reseed() -> None:
        ts.reseed(scene.train, args.seed, dist.runtime().rank, dist.runtime().size)

    resume(ts, args.resume or args.load_snapshot, ckpts, reseed, elastic=dist.elastic())

    dist.log(f"training {args.n_steps} steps" + (f" (or {args.time_budget_s:g} s)" if args.time_budget_s else "")
             + f", {args.target_samples} samples/step/rank, grid {grid.resolution}^3 x {grid.n_cascades}, "
               f"{march.n_steps} steps/ray max")
    guard = NonFiniteGuard(args.nonfinite_limit)
    clock = RunClock(args.time_budget_s, args.ckpt_every_minutes)
    watchdog = Watchdog(args.watchdog_s, rt.rank).start()
    config = {"args": vars_for_json(args)}

    def train_loop(commit: Callable[[], None] | None = None) -> None:
        """Steps from ``ts.step`` to the end (re-entered after an elastic reset)."""
        rt = dist.runtime()
        progress = ts.progress
        stats = IntervalStats()
        with watchdog.armed():
            while ts.step < args.n_steps:
                step = ts.step + 1  # the step being taken, 1-based like the log lines
                faults.at_step(step)
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(ts.step) * lr_scale(args.lr_scaling, rt.size)
                if ts.step % march.update_interval == 0:
                    grid.update(lambda x: field.query_density(x)[0], march.dt, ts.step, march.warmup_steps, args.seed)
                rays = ts.sampler.sample(ts.n_rays)
                if scene.has_alpha and args.train_background == "random":
                    background = torch.rand((len(rays), 3), generator=ts.bg_gen, device=rt.device)
                else:
                    background = torch.tensor(BACKGROUNDS.get(args.train_background, (0.0, 0.0, 0.0)), device=rt.device)
                    background = background.expand(len(rays), 3)
                jitter = torch.rand(len(rays), generator=ts.bg_gen, device=rt.device)
                res = train_step(field, grid, optimizer, rays, background, march, loss_fn, jitter, args.precision, scaler,
                                 guard, step)
                if not res.skipped:
                    stats.add(res.loss, res.mse, len(rays), res.n_samples, res.n_candidates)
                # Adapt the ray count so the next step carries about target_samples samples (instant-ngp's rule).
                per_ray = max(res.n_samples, 1) / len(rays)
                ts.n_rays = int(min(max(args.target_samples / per_ray, 64), args.max_rays)) // 64 * 64
                ts.step = step
                watchdog.kick(step)

                if step % args.log_every == 0 or step == args.n_steps:
                    if rt.device.type == "cuda":
                        torch.cuda.synchronize()
                    r = stats.reduce(rt.device)
                    progress["train_seconds"] += r["seconds"]
                    progress["total_samples"] += r["samples"]
                    line = (f"[step {step}] {r['samples'] / max(r['seconds'], 1e-9) / 1e6:.3f} M samples/s | "
                            f"{r['rays_per_step']:.0f} rays/step | loss {r['loss']:.5f} | train PSNR {mse_to_psnr(r['mse']):.2f} | "
                            f"occupied {100 * grid.occupancy_fraction():.1f}% | {progress['train_seconds']:.1f} s")
                    dist.log(line)
                    progress["history"].append({"step": step, "seconds": round(progress["train_seconds"], 3), "loss": r["loss"],
                                                "train_psnr": mse_to_psnr(r["mse"]),
                                                "samples_per_sec": r["samples"] / max(r["seconds"], 1e-9)})
                    if args.eval_every and step % args.eval_every == 0 and step < args.n_steps:
                        with watchdog.paused():
                            ev = evaluate(field, grid, scene.test, march, args.eval_background, args.n_eval_views)
                        dist.log(f"[step {step}] test PSNR {ev['psnr']:.2f} dB over {ev['views']} views")
                        progress["history"][-1]["test_psnr"] = ev["psnr"]
                    stats = IntervalStats()
                verdict = clock.poll(step)
                if ckpts.due_by_steps(step) or verdict.checkpoint or (verdict.stop and checkpointing):
                    with watchdog.paused():
                        path = ckpts.write(ts, config)
                    clock.checkpointed()
                    dist.log(f"[step {step}] checkpoint {path}")
                if commit is not None:
                    commit()
                if verdict.stop:
                    break
        if stats.steps:  # the partial interval before a time-budget stop
            r = stats.reduce(rt.device)
            progress["train_seconds"] += r["seconds"]
            progress["total_samples"] += r["samples"]

    if dist.elastic():
        elastic.run(train_loop, ts, scene.train, args.seed, args.commit_every)
    else:
        train_loop()
    watchdog.stop()
    step, progress = ts.step, ts.progress
    if checkpointing and not ckpts.due_by_steps(step) and not any(s == step for s, _ in ckpts.existing()):
        dist.log(f"[step {step}] checkpoint {ckpts.write(ts, config)}")

    ev = evaluate(field, grid, scene.test, march, args.eval_background, args.n_eval_views,
                  out_dir / "renders", args.save_renders)
    train_seconds = progress["train_seconds"]
    samples_per_sec = progress["total_samples"] / max(train_seconds, 1e-9)
    dist.log(f"done: {step} steps in {train_seconds:.1f} s, {samples_per_sec / 1e6:.3f} M samples/s, "
             f"test PSNR {ev['psnr']:.2f} dB over {ev['views']} views")
    if args.save_snapshot:
        checkpoint.save(ts, args.save_snapshot, config)
    rt = dist.runtime()
    metrics = {"world_size": rt.size, "steps": step, "train_seconds": round(train_seconds, 3),
               "samples_per_sec": samples_per_sec, "test_psnr": ev["psnr"], "test_views": ev["views"],
               "psnr_per_view": ev.get("psnr_per_view", []), "device": device_name(rt.device), "backend": backend,
               "precision": args.precision, "controller": rt.controller, "scene": scene.source, "config": source,
               "nonfinite_skipped_steps": guard.skipped, "history": progress["history"]}
    if rt.is_root:
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
        if args.metrics_json:
            Path(args.metrics_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.metrics_json).write_text(json.dumps(metrics, indent=1))
    return RunResult(field, grid, step, metrics)


def prepare_outputs(args: argparse.Namespace, out_dir: Path, ckpt_dir: Path | None) -> None:
    """Rank 0: create the output folders and prove they are writable now, not after hours of training."""
    if not dist.runtime().is_root:
        return
    folders = [("output folder (--out_dir)", out_dir)]
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


def vars_for_json(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, dict, list, type(None)))}


def cli(argv: list[str] | None = None) -> None:
    """Console-script wrapper: any failure becomes one clear message naming the rank, and a fast non-zero exit.

    User errors exit 2; unexpected exceptions 1 (see ``failures.report``). Leaving with ``os._exit``
    matters: Horovod's shutdown waits for its background thread, which can block after an error.
    """
    try:
        code = main(argv)
    except SystemExit:
        raise
    except BaseException as exc:
        code = report(exc)
    sys.stdout.flush()
    os._exit(code) if code else sys.exit(0)


if __name__ == "__main__":
    cli()
