"""One rank count of ``bench scaling``; every rank runs it under the launcher, rank 0 writes the result.

    python -m hvd_ngp.bench._scaling_rank --result PATH [--ceiling_repeats N] -- <trainer options>

1. the allreduce ceiling (Horovod vs raw torch.distributed) for this model's gradient sizes, and one
   Adam update of them allreduced against sharded (reduce-scatter, 1/n of the update, all-gather);
2. training as ``hvd_ngp.train`` does it; its monitor measures, per log interval, the share of time
   blocked in collectives, GPU utilisation and energy (NVML);
3. rank 0 writes {samples per rank and step, throughput, seconds per step, communication share, GPU
   utilization, energy, PSNR history, ceiling, update}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cluster import dist
from ..config import BASE_CONFIG, CPU_CONFIG, parse_settings
from ..errors import run_cli
from ..model.encoding import model_for_backend
from ..model.field import NGPField
from ..options import options_from
from ..tools.launch import split_program_args
from ..training.trainer import run
from . import _collectives


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.bench._scaling_rank")
    p.add_argument("--result", required=True, help="JSON written by rank 0")
    p.add_argument("--ceiling_repeats", type=int, default=20, help="timed allreduces per tensor (after 3 warm-up)")
    return p


def gradient_sizes(model: dict) -> dict[str, int]:
    """Parameter name -> number of values of the field this config builds (what the optimizer reduces)."""
    field = NGPField(model_for_backend(model, "torch"), torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), "torch")
    return {name: p.numel() for name, p in field.named_parameters()}


def steady_throughput(history: list[dict]) -> float:
    """Samples/s over the log intervals after the first (occupancy warm-up, allocator, first kernels)."""
    bounds = [0.0] + [h["seconds"] for h in history]
    intervals = [(h["samples_per_sec"], bounds[i + 1] - bounds[i]) for i, h in enumerate(history)]
    intervals = intervals[1:] if len(intervals) > 1 else intervals
    seconds = sum(s for _, s in intervals)
    return sum(rate * s for rate, s in intervals) / seconds if seconds > 0 else 0.0


def steady_step_seconds(history: list[dict]) -> float | None:
    """Seconds per step over the log intervals after the first (as ``steady_throughput``); None without steps."""
    points = [(0, 0.0)] + [(h["step"], h["seconds"]) for h in history]
    if len(points) > 2:
        points = points[1:]
    steps = points[-1][0] - points[0][0]
    return (points[-1][1] - points[0][1]) / steps if steps > 0 else None


def interval_mean(history: list[dict], key: str) -> float | None:
    """Time-weighted mean of a monitor field over the log intervals; None when any interval lacks it."""
    pairs = [(h.get(key), h.get("interval_s") or 0.0) for h in history]
    known = [(v, s) for v, s in pairs if v is not None]
    seconds = sum(s for _, s in pairs)
    if not pairs or seconds <= 0 or len(known) < len(pairs):
        return None
    return sum(v * s for v, s in known) / seconds


@dataclass(frozen=True)
class ScalingRankOptions:
    """One rank's side of ``bench scaling``: where its result goes and how often the ceiling is timed."""

    result: str
    ceiling_repeats: int


def main(argv: list[str] | None = None) -> int:
    own, trainer_argv = split_program_args(sys.argv[1:] if argv is None else argv)
    opts = options_from(ScalingRankOptions, build_parser().parse_args(own))
    settings = parse_settings(trainer_argv, default_config=BASE_CONFIG if torch.cuda.is_available() else CPU_CONFIG)
    comm, device = settings.runtime.comm, settings.runtime.device
    rt = dist.init(device, settings.runtime.threads, env=comm.init_env(os.environ, dist.wants_cuda(device)))
    sizes = gradient_sizes(settings.model.blocks)  # builds the model on the CPU once
    ceiling = _collectives.measure(sizes, comm.block, opts.ceiling_repeats)
    update = _collectives.measure_update(sizes, opts.ceiling_repeats, settings.step.seed)

    result = run(settings)  # the monitor measures comm share, GPU utilisation and energy per log interval
    if rt.is_root:
        history, train_s = result.metrics["history"], result.metrics["train_seconds"]
        energies = [h.get("energy_j") for h in history]
        energy = None if not energies or None in energies else sum(energies)
        samples = result.metrics["samples_per_sec"] * train_s
        out = {
            "ranks": rt.size,
            "nodes": rt.cross_size,
            "device": result.metrics["device"],
            "controller": rt.controller,
            "steps": result.step,
            "train_seconds": train_s,
            "target_samples": settings.step.target_samples,  # per rank and step, as this run parsed it
            "samples_per_sec": result.metrics["samples_per_sec"],
            "steady_samples_per_sec": steady_throughput(history),
            "steady_step_s": steady_step_seconds(history),
            "comm_share": interval_mean(history, "comm_fraction") if rt.size > 1 else 0.0,
            "gpu_util_percent": interval_mean(history, "gpu_util"),
            "energy_j": energy,
            "samples_per_joule": samples / energy if energy else None,
            "test_psnr": result.metrics["test_psnr"],
            "psnr_curve": [(c["seconds"], c["psnr"]) for c in result.metrics["curve"]],
            "communication": result.metrics["communication"],
            "ceiling": ceiling,
            "update": update,
        }
        Path(opts.result).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.result).write_text(json.dumps(out, indent=1))
    dist.barrier()
    return 0


if __name__ == "__main__":
    run_cli(main, prog="hvd_ngp.bench")
