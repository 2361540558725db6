"""``python -m hvd_ngp.bench sampling``: sampling strategies, load balance and streamed images, side by side.

Launch it like the trainer (``horovodrun -np 2 -H localhost:2 python -m hvd_ngp.bench sampling ...``);
every rank trains the same variants in the same order, each for ``--time_budget_s`` seconds of
training with test evaluations at ``--eval_points`` evenly spaced times (evaluation is off the clock):

- ``uniform``, ``complexity``, ``error_map``: ``--sampling`` with the default balance (samples: each
  rank sizes its batch to the same samples per step);
- ``balance_off``: uniform sampling with equal rays per rank (the unbalanced baseline);
- ``balance_time``: uniform sampling, sample targets moved between ranks by their measured step times;
- ``streamed``: uniform sampling with device and host image budgets of ``--memory_cap_gb`` (default:
  half the decoded training images), so the images stream from disk by shard.

Reports per variant: test PSNR at the end, time to ``--target_psnr`` (default: the lowest final PSNR
of the three strategies, so each reaches it; interpolated between evaluations), samples/s and rays/s,
the median per-rank step-time spread ((max - min) / max of the per-rank busy time per step) and GPU
utilisation spread (percentage points) over the log intervals after the first, and the data
decisions (placement, sample shares, rebalances).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..cluster import dist
from ..config import BASE_CONFIG, CPU_CONFIG, parse_settings
from ..data import load_scene
from ..data.pipeline import STRATEGIES
from ..data.pixels import GIB, human_bytes, image_bytes
from ..errors import ConfigError
from ..options import options_from
from ..settings import Settings
from ..training.trainer import run
from .report import append_markdown, table, write_json

VARIANTS = {
    "uniform": ["--sampling", "uniform"],
    "complexity": ["--sampling", "complexity"],
    "error_map": ["--sampling", "error_map"],
    "balance_off": ["--sampling", "uniform", "--balance", "off"],
    "balance_time": ["--sampling", "uniform", "--balance", "time"],
    "streamed": ["--sampling", "uniform", "--preload", "auto"],  # + the memory cap
}


def time_to_psnr(curve: list[dict], target: float) -> float | None:
    """Training seconds at which the test PSNR first reaches ``target`` (linear between evaluations)."""
    prev = {"seconds": 0.0, "psnr": None}
    for point in curve:
        if point["psnr"] >= target:
            if prev["psnr"] is None or point["psnr"] == prev["psnr"]:
                return float(point["seconds"])
            f = (target - prev["psnr"]) / (point["psnr"] - prev["psnr"])
            return float(prev["seconds"] + max(f, 0.0) * (point["seconds"] - prev["seconds"]))
        prev = point
    return None


def median_after_first(history: list[dict], key: str) -> float | None:
    values = [h[key] for h in history[1:] if h.get(key) is not None] or [
        h[key] for h in history if h.get(key) is not None
    ]
    return statistics.median(values) if values else None


def summarise(name: str, metrics: dict) -> dict:
    """One variant's figures from its ``metrics.json`` content."""
    history = metrics["history"]
    rays, last = 0.0, 0
    for h in history:  # rays_per_step is all ranks together, averaged over the interval
        rays += h["rays_per_step"] * (h["step"] - last)
        last = h["step"]
    seconds = max(metrics["train_seconds"], 1e-9)
    return {
        "variant": name,
        "final_psnr": metrics["test_psnr"],
        "train_seconds": metrics["train_seconds"],
        "steps": metrics["steps"],
        "samples_per_sec": metrics["samples_per_sec"],
        "rays_per_sec": rays / seconds,
        "step_time_spread": median_after_first(history, "step_time_spread"),
        "gpu_util_spread": median_after_first(history, "gpu_util_spread"),
        "curve": metrics["curve"],
        "data": metrics["data"],
    }


def percent(v: float | None) -> str:
    return f"{100 * v:.0f}%" if v is not None else "n/a"


@dataclass(frozen=True)
class SamplingOptions:
    """The command line of ``python -m hvd_ngp.bench sampling`` (``main``'s parser holds each option's help)."""

    scene: str
    config: str | None
    device: str
    variants: str
    time_budget_s: float
    eval_points: int
    log_every: int
    target_psnr: float
    warmup_steps: int | None
    memory_cap_gb: float
    out: str
    json: str
    markdown: str
    extra: list[str]  # trainer flags (all variants)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.bench sampling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scene", default="builtin")
    p.add_argument("--config", default=None, help="trainer config (default: base.json on GPU, cpu.json on CPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--time_budget_s", type=float, default=60.0, help="training seconds per variant")
    p.add_argument("--eval_points", type=int, default=6, help="test evaluations per variant (the last at the end)")
    p.add_argument("--log_every", type=int, default=50, help="steps per log interval (spreads are per interval)")
    p.add_argument("--target_psnr", type=float, default=0.0, help="for time-to-PSNR (0: see above)")
    p.add_argument(
        "--warmup_steps",
        type=int,
        default=None,
        help="untimed steps of the first variant before any is measured, so kernel compilation is "
        "not charged to it (default: 100 on GPU, 0 on CPU)",
    )
    p.add_argument(
        "--memory_cap_gb",
        type=float,
        default=0.0,
        help="device and host image budget of the streamed variant (0: half the decoded images)",
    )
    p.add_argument("--out", default="runs/bench/sampling", help="one trainer output folder per variant under here")
    p.add_argument("--json", default="runs/bench/sampling.json")
    p.add_argument("--markdown", default="", help="also append a dated Markdown section to this file (default: none)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after '--': more trainer flags (all variants)")
    opts = options_from(SamplingOptions, p.parse_args(argv))
    opts = replace(opts, extra=[a for a in opts.extra if a != "--"])
    names = [v.strip() for v in opts.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise ConfigError(f"--variants: unknown {unknown} (known: {', '.join(VARIANTS)})")
    if opts.time_budget_s <= 0 or opts.eval_points < 1:
        raise ConfigError("--time_budget_s must be positive and --eval_points at least 1")
    rt = dist.init(opts.device)

    base = [
        "--scene",
        opts.scene,
        "--device",
        opts.device,
        "--n_steps",
        "100000000",
        "--time_budget_s",
        str(opts.time_budget_s),
        "--save_renders",
        "0",
        "--log_every",
        str(opts.log_every),
    ]
    if opts.eval_points > 1:
        base += [
            "--eval_at_s",
            ",".join(f"{opts.time_budget_s * k / opts.eval_points:g}" for k in range(1, opts.eval_points)),
        ]
    if opts.config:
        base = ["--config", opts.config, *base]
    default_config = BASE_CONFIG if opts.device != "cpu" else CPU_CONFIG

    def trainer_settings(name: str, cap_gb: float = 0.0, last: Sequence[str] = ()) -> Settings:
        """The variant's trainer settings: the common flags, the variant's, the user's after '--', then ``last``."""
        flags = [*base, *VARIANTS[name], "--out_dir", str(Path(opts.out) / name)]
        if name == "streamed":
            flags += ["--device_image_budget_gb", f"{cap_gb:.9f}", "--host_image_budget_gb", f"{cap_gb:.9f}"]
        return parse_settings([*flags, *opts.extra, *last], default_config=default_config)

    cap_gb, decoded = opts.memory_cap_gb, 0
    if "streamed" in names:
        sc = trainer_settings("uniform").scene
        frames = load_scene(sc.scene, **sc.load_kwargs(), lazy_train=True).train  # as the trainer loads it
        decoded = image_bytes(frames.sizes, 4)
        cap_gb = cap_gb or decoded / 2 / GIB

    warmup = opts.warmup_steps if opts.warmup_steps is not None else (100 if opts.device == "cuda" else 0)
    if warmup > 0:  # Triton compiles its kernels on first use: keep that out of the first variant's budget
        dist.log(f"=== bench sampling: warm-up, {warmup} steps of {names[0]} (not reported) ===")
        warm = ["--n_steps", str(warmup), "--time_budget_s", "0", "--eval_at_s", "", "--eval_at_steps", ""]
        warm += ["--n_eval_views", "1", "--out_dir", str(Path(opts.out) / "warmup"), "--metrics_json", ""]
        run(trainer_settings(names[0], cap_gb, warm))

    results = []
    for name in names:
        dist.log(f"=== bench sampling: {name} ===")
        metrics = run(trainer_settings(name, cap_gb)).metrics
        if name == "streamed" and metrics["data"]["placement"] != "stream":
            raise ConfigError(
                f"the streamed variant placed the images on {metrics['data']['placement']}: "
                f"--memory_cap_gb {cap_gb:g} is not below their decoded size"
            )
        results.append(summarise(name, metrics))

    by = {r["variant"]: r for r in results}
    finals = [by[s]["final_psnr"] for s in STRATEGIES if s in by]
    target = opts.target_psnr or (min(finals) if finals else min(r["final_psnr"] for r in results))
    for r in results:
        r["time_to_target_s"] = time_to_psnr(r["curve"], target)
    ref = by.get("uniform")
    rows = []
    for r in results:
        t = r["time_to_target_s"]
        rel = (
            f"{100 * (r['samples_per_sec'] / ref['samples_per_sec'] - 1):+.0f}%"
            if ref is not None and r is not ref
            else ""
        )
        rows.append(
            {
                "variant": r["variant"],
                "final PSNR": f"{r['final_psnr']:.2f}",
                f"s to {target:.2f} dB": f"{t:.1f}" if t is not None else "not reached",
                "steps": str(r["steps"]),
                "M samples/s": f"{r['samples_per_sec'] / 1e6:.3f}",
                "vs uniform": rel,
                "k rays/s": f"{r['rays_per_sec'] / 1e3:.1f}",
                "step spread": percent(r["step_time_spread"]),
                "GPU util spread": f"{r['gpu_util_spread']:.1f} pp" if r["gpu_util_spread"] is not None else "n/a",
                "images": r["data"]["placement"],
                "rebalances": str(r["data"]["rebalances"]),
            }
        )
    device = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu"
    cap = (
        f"; streamed variant: image budget {human_bytes(int(cap_gb * GIB))} for {human_bytes(decoded)} decoded"
        if "streamed" in names
        else ""
    )
    text = "\n\n".join(
        [
            f"{rt.size} rank(s) [{rt.controller}] on {device}; scene {opts.scene}; {opts.time_budget_s:g} s of training "
            f"per variant, {opts.eval_points} test evaluations{cap}. Step spread: median over the log intervals "
            f"after the first of (max - min) / max of the per-rank busy time per step.",
            table(rows, list(rows[0])),
        ]
    )
    result = {
        "device": device,
        "world_size": rt.size,
        "controller": rt.controller,
        "target_psnr": target,
        "memory_cap_gb": cap_gb if "streamed" in names else None,
        "decoded_bytes": decoded,
        "options": asdict(opts),
        "variants": results,
    }
    if rt.is_root:
        print(text, flush=True)
        if opts.json:
            write_json(opts.json, result)
        if opts.markdown:
            append_markdown(
                opts.markdown,
                "Sampling strategies, load balance, streamed images",
                text,
                ["sampling", *(argv if argv is not None else [])],
            )
    return result
