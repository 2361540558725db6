"""Live training metrics: per-rank measurements reduced once per log interval, shown and kept by rank 0.

Every rank fills its row of a ``[world_size, len(RANK_FIELDS)]`` float64 table (zeros elsewhere,
NaN where it cannot measure) and ONE Sum-allreduce gives every rank the whole table; totals,
means, minima and maxima with the rank that holds them are computed locally from it. Rank 0 then
prints one line, appends one JSON object to ``metrics.jsonl`` (fields: ``JSONL_FIELDS``), writes
TensorBoard scalars when asked and drives a tqdm progress bar in a terminal.

Sources: throughput and loss from ``metrics.IntervalStats`` (kept on the device during the
interval), the communication share from ``commclock.COMM_CLOCK`` (its definition is there), GPU
utilisation, memory and power from NVML (``nvml.GpuSampler``, a background thread: no host-device
synchronisation per step). Energy counts the GPUs only, each physical GPU once.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np
import torch

from ..cluster import dist
from ..cluster.commclock import COMM_CLOCK
from ..errors import ConfigError
from .memory import GIB, MemoryMeter
from .metrics import COL, RANK_FIELDS, UNLIMITED_STEPS, IntervalStats, mse_to_psnr
from .nvml import GpuSampler

#: every key of a metrics.jsonl record: description and TensorBoard tag (None: not a scalar worth plotting)
JSONL_FIELDS: dict[str, tuple[str, str | None]] = {
    "step": ("training steps done at the end of the interval", None),
    "time": ("Unix time when rank 0 wrote the record", None),
    "world_size": ("number of ranks", None),
    "interval_steps": ("steps in this interval", None),
    "interval_s": ("wall seconds of the interval on the slowest rank (evaluation excluded)", None),
    "train_s": ("training seconds so far on rank 0 (evaluation excluded)", None),
    "samples": ("ray-marching samples processed by all ranks in the interval", None),
    "samples_per_s": ("samples / interval_s: the job's throughput", "throughput/samples_per_s"),
    "rank_samples_per_s_min": (
        "lowest per-rank compute throughput: its samples / its seconds not spent in "
        "collectives (all ranks share one wall clock, so this is how the slowest rank shows)",
        "throughput/slowest_rank_samples_per_s",
    ),
    "rank_samples_per_s_min_rank": ("the slowest rank by that measure", None),
    "rank_step_ms_min": (
        "shortest per-rank busy time per step in ms: interval seconds minus seconds blocked in "
        "collectives, over steps; null with --comm_timing off",
        None,
    ),
    "rank_step_ms_min_rank": ("rank with the shortest busy time per step", None),
    "rank_step_ms_max": ("longest per-rank busy time per step in ms (the straggler)", "balance/rank_step_ms_max"),
    "rank_step_ms_max_rank": ("rank with the longest busy time per step", None),
    "step_time_spread": (
        "(max - min) / max of the per-rank busy time per step: 0 balanced, 1 a rank idles "
        "throughout (what --balance time evens out)",
        "balance/step_time_spread",
    ),
    "rays_per_step": ("rays per step, all ranks together", "throughput/rays_per_step"),
    "samples_per_step": ("samples per step, all ranks together", None),
    "loss": ("training loss, mean over ranks and steps", "train/loss"),
    "train_psnr": (
        "PSNR in dB of the mean training MSE (on the training backgrounds); null if the MSE is 0",
        "train/psnr",
    ),
    "occupancy": ("fraction of occupied cells in the occupancy grid (identical on every rank)", "train/occupancy"),
    "comm_fraction": (
        "mean over ranks of seconds blocked in collectives / interval seconds (see hvd_ngp/cluster/commclock.py);"
        " null with --comm_timing off",
        "comm/fraction_mean",
    ),
    "comm_fraction_min": ("lowest per-rank comm fraction (often the straggler: it waits least)", None),
    "comm_fraction_min_rank": ("rank with the lowest comm fraction", None),
    "comm_fraction_max": ("highest per-rank comm fraction", "comm/fraction_max"),
    "comm_fraction_max_rank": ("rank with the highest comm fraction", None),
    "gpu_util": ("mean GPU utilisation in % over ranks (NVML); null without NVML", "gpu/util_mean"),
    "gpu_util_min": ("lowest per-rank GPU utilisation in %", "gpu/util_min"),
    "gpu_util_min_rank": ("rank with the lowest GPU utilisation", None),
    "gpu_util_max": ("highest per-rank GPU utilisation in %", None),
    "gpu_util_max_rank": ("rank with the highest GPU utilisation", None),
    "gpu_util_spread": ("highest minus lowest per-rank GPU utilisation in percentage points", "gpu/util_spread"),
    "gpu_mem_used_gib_max": (
        "largest GPU memory in use in GiB (all processes on that GPU, like nvidia-smi)",
        "gpu/mem_used_gib_max",
    ),
    "gpu_mem_used_gib_max_rank": ("rank whose GPU uses the most memory", None),
    "gpu_mem_total_gib": ("memory size in GiB of that GPU", None),
    "step_mem_allocated_gib_max": (
        "largest peak of torch-allocated GPU memory in GiB of one rank's training steps in "
        "the interval (this process only, unlike gpu_mem_used)",
        "memory/step_allocated_gib",
    ),
    "step_mem_reserved_gib_max": (
        "largest peak of GPU memory torch's caching allocator reserved in the training steps "
        "of the interval, in GiB (one rank)",
        "memory/step_reserved_gib",
    ),
    "eval_mem_allocated_gib_max": (
        "largest peak of torch-allocated GPU memory in GiB of one rank's evaluations so far; null before the first",
        None,
    ),
    "eval_mem_reserved_gib_max": (
        "largest peak of GPU memory reserved by torch in one rank's evaluations so far, in GiB; null before the first",
        "memory/eval_reserved_gib",
    ),
    "gpus_measured": ("distinct GPUs with a power reading (ranks sharing a GPU count it once)", None),
    "power_w": ("mean power draw in W of those GPUs together", "energy/power_w"),
    "energy_j": ("energy in J those GPUs used in the interval (driver counter, else power x time)", "energy/energy_j"),
    "samples_per_joule": ("samples / energy_j: energy efficiency (GPU energy only)", "energy/samples_per_joule"),
}


# ------------------------------------------------------------------------------------ reduction


@dataclass(frozen=True)
class Spread:
    """A column across ranks, NaN (not measured) rows ignored."""

    mean: float
    total: float
    min: float
    min_rank: int
    max: float
    max_rank: int
    count: int


def spread(values: np.ndarray) -> Spread | None:
    """``values`` ``[world_size]`` -> mean/total/min/max with ranks (ties: lowest rank), or None if all NaN."""
    ranks = np.flatnonzero(np.isfinite(values))
    if ranks.size == 0:
        return None
    v = values[ranks]
    lo, hi = int(np.argmin(v)), int(np.argmax(v))
    return Spread(
        float(v.mean()), float(v.sum()), float(v[lo]), int(ranks[lo]), float(v[hi]), int(ranks[hi]), int(ranks.size)
    )


def extremes(name: str, s: Spread | None) -> dict[str, float | int | None]:
    """``{name}_min``, ``{name}_min_rank``, ``{name}_max``, ``{name}_max_rank`` of ``s`` (None: not measured)."""
    return {
        f"{name}_min": s.min if s else None,
        f"{name}_min_rank": s.min_rank if s else None,
        f"{name}_max": s.max if s else None,
        f"{name}_max_rank": s.max_rank if s else None,
    }


def gather_rows(row: torch.Tensor) -> torch.Tensor:
    """Every rank's ``row`` ``[k]`` -> ``[world_size, k]`` on every rank, with ONE Sum-allreduce (collective)."""
    rt = dist.runtime()
    table = torch.zeros(rt.size, row.numel(), dtype=torch.float64)
    table[rt.rank] = row.to(torch.float64)
    return dist.allreduce(table, "sum", name="monitor.interval")


def interval_record(table: np.ndarray, step: int, train_s: float, occupancy: float | None) -> dict[str, Any]:
    """The reduced table ``[world_size, len(RANK_FIELDS)]`` -> one metrics.jsonl record (keys: JSONL_FIELDS)."""
    size = table.shape[0]
    col = {name: table[:, i] for name, i in COL.items()}
    steps = max(float(col["steps"].max()), 1.0)
    seconds = col["seconds"]
    interval_s = max(float(seconds.max()), 1e-9)
    samples = float(col["samples"].sum())
    mse = float(col["mse_sum"].sum()) / size / steps
    comm_s = col["comm_seconds"]
    busy = seconds - np.where(np.isfinite(comm_s), comm_s, 0.0)  # time not spent waiting in collectives
    with np.errstate(divide="ignore", invalid="ignore"):
        rank_rate = spread(col["samples"] / np.maximum(busy, 1e-9))
        comm = spread(comm_s / np.maximum(seconds, 1e-9))
        step_ms = spread(np.where(np.isfinite(comm_s), busy, np.nan) / np.maximum(col["steps"], 1.0) * 1e3)
    util = spread(col["gpu_util"])
    mem = spread(col["gpu_mem_used"])
    # power and energy: each physical GPU once (the first rank that reports it)
    ids = col["gpu_id"]
    owner = np.array([np.isfinite(ids[r]) and not np.any(ids[:r] == ids[r]) for r in range(size)], dtype=bool)
    power = spread(np.where(owner, col["gpu_power"], np.nan))
    energy = spread(np.where(owner, col["gpu_energy"], np.nan))
    energy_j = energy.total if energy is not None and energy.total > 0 else None
    record = {
        "step": step,
        "time": time.time(),
        "world_size": size,
        "interval_steps": int(steps),
        "interval_s": interval_s,
        "train_s": train_s,
        "samples": samples,
        "samples_per_s": samples / interval_s,
        "rank_samples_per_s_min": rank_rate.min if rank_rate else None,
        "rank_samples_per_s_min_rank": rank_rate.min_rank if rank_rate else None,
        **extremes("rank_step_ms", step_ms),
        "step_time_spread": (step_ms.max - step_ms.min) / step_ms.max if step_ms and step_ms.max > 0 else None,
        "rays_per_step": float(col["rays"].sum()) / steps,
        "samples_per_step": samples / steps,
        "loss": float(col["loss_sum"].sum()) / size / steps,
        "train_psnr": mse_to_psnr(mse),
        "occupancy": occupancy,
        "comm_fraction": comm.mean if comm else None,
        **extremes("comm_fraction", comm),
        "gpu_util": util.mean if util else None,
        **extremes("gpu_util", util),
        "gpu_util_spread": util.max - util.min if util else None,
        "gpu_mem_used_gib_max": mem.max / GIB if mem else None,
        "gpu_mem_used_gib_max_rank": mem.max_rank if mem else None,
        "gpu_mem_total_gib": (
            float(col["gpu_mem_total"][mem.max_rank]) / GIB
            if mem and math.isfinite(col["gpu_mem_total"][mem.max_rank])
            else None
        ),
        **{
            f"{name}_gib_max": (lambda m: m.max / GIB if m else None)(spread(col[name]))
            for name in ("step_mem_allocated", "step_mem_reserved", "eval_mem_allocated", "eval_mem_reserved")
        },
        "gpus_measured": power.count if power else 0,
        "power_w": power.total if power else None,
        "energy_j": energy_j,
        "samples_per_joule": samples / energy_j if energy_j else None,
    }
    # JSON has no NaN/Infinity: anything not finite is "not measured"
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


# ------------------------------------------------------------------------------------ presentation


def _si(x: float) -> str:
    """12345.6 -> '12.3 k' (3 significant digits, SI prefix)."""
    for scale, unit in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def format_line(rec: dict[str, Any]) -> str:
    """One line for humans: ``[step 1200] 98.4 M samples/s | GPU util 91% (min 88% rank 3) | comm 4.1% | ...``;
    an interval that counted no ray (its one step was the uncounted warm-up, as right after a resume) says so
    instead of printing zeros and an infinite PSNR."""
    na = "n/a"
    if rec["samples"] == 0 and rec["rays_per_step"] == 0:
        return f"[step {rec['step']}] nothing measured yet (the warm-up step is not counted) | {rec['train_s']:.1f} s"
    parts = [f"[step {rec['step']}] {rec['samples_per_s'] / 1e6:.3f} M samples/s"]
    if rec["gpu_util"] is None:
        parts.append(f"GPU util {na}")
    elif rec["world_size"] > 1:
        parts.append(
            f"GPU util {rec['gpu_util']:.0f}% (min {rec['gpu_util_min']:.0f}% rank {rec['gpu_util_min_rank']})"
        )
    else:
        parts.append(f"GPU util {rec['gpu_util']:.0f}%")
    if rec["gpu_mem_used_gib_max"] is None:
        parts.append(f"GPU mem {na}")
    else:
        total = f"/{rec['gpu_mem_total_gib']:.1f}" if rec["gpu_mem_total_gib"] is not None else ""
        parts.append(f"GPU mem {rec['gpu_mem_used_gib_max']:.1f}{total} GiB")
    if rec.get("step_mem_reserved_gib_max") is not None:
        ev = rec.get("eval_mem_reserved_gib_max")
        parts.append(
            f"torch step {rec['step_mem_reserved_gib_max']:.2f} GiB"
            + (f", eval {ev:.2f} GiB" if ev is not None else "")
        )
    parts.append(f"comm {100 * rec['comm_fraction']:.1f}%" if rec["comm_fraction"] is not None else f"comm {na}")
    if rec["world_size"] > 1 and rec["step_time_spread"] is not None:
        parts.append(f"step spread {100 * rec['step_time_spread']:.0f}% (slowest rank {rec['rank_step_ms_max_rank']})")
    parts.append(f"{rec['power_w']:.0f} W" if rec["power_w"] is not None else f"power {na}")
    parts.append(
        f"{_si(rec['samples_per_joule'])} samples/J" if rec["samples_per_joule"] is not None else f"samples/J {na}"
    )
    parts.append(f"loss {rec['loss']:.5f}")
    parts.append(f"train PSNR {rec['train_psnr']:.2f}" if rec["train_psnr"] is not None else "train PSNR inf")
    parts.append(f"{rec['rays_per_step']:.0f} rays/step")
    if rec["occupancy"] is not None:
        parts.append(f"occupied {100 * rec['occupancy']:.1f}%")
    parts.append(f"{rec['train_s']:.1f} s")
    return " | ".join(parts)


# ------------------------------------------------------------------------------------ the monitor


@dataclass(frozen=True)
class MonitorFlags:
    """The monitoring option group as parsed (``MonitorSettings.add_options``), with the output flags it
    depends on (where metrics.jsonl goes by default; a resumed run appends to it)."""

    metrics_jsonl: str | None
    tensorboard: str | None
    progress: str  # auto | on | off
    comm_timing: str  # on | off
    gpu_sample_period_s: float
    out_dir: str
    load_snapshot: str | None
    resume: str | None


@dataclass(frozen=True)
class MonitorSettings:
    """What to measure and where rank 0 writes it."""

    jsonl: Path | None
    tensorboard: Path | None
    progress: bool
    comm_timing: bool
    gpu_sample_period_s: float
    append: bool  # a resumed run appends to its metrics.jsonl

    @staticmethod
    def add_options(p: argparse.ArgumentParser) -> None:
        """Declare the monitoring option group (parsed into ``MonitorFlags``, validated by ``from_flags``)."""
        g = p.add_argument_group("monitoring")
        g.add_argument(
            "--metrics_jsonl",
            default=None,
            metavar="PATH",
            help="one JSON object per log interval (rank 0); default OUT_DIR/metrics.jsonl, 'none' to switch off",
        )
        g.add_argument(
            "--tensorboard",
            default=None,
            metavar="DIR",
            help="also write TensorBoard scalars here (rank 0; needs the tensorboard package)",
        )
        g.add_argument(
            "--progress",
            choices=("auto", "on", "off"),
            default="auto",
            help="tqdm progress bar on rank 0 (auto: only when stderr is a terminal)",
        )
        g.add_argument(
            "--comm_timing",
            choices=("on", "off"),
            default="on",
            help="measure the time blocked in collectives (the 'comm' share; syncs the compute stream "
            "just before each blocking collective, where the host waits anyway)",
        )
        g.add_argument(
            "--gpu_sample_period_s",
            type=float,
            default=0.5,
            help="seconds between NVML samples of GPU utilisation, memory and power (background thread)",
        )

    @staticmethod
    def from_flags(flags: MonitorFlags) -> "MonitorSettings":
        """Validate the monitoring options (the same on every rank: call through ``dist.agree``)."""
        if flags.gpu_sample_period_s <= 0:
            raise ConfigError(f"--gpu_sample_period_s must be positive, got {flags.gpu_sample_period_s}")
        if flags.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(
                "--tensorboard needs the 'tensorboard' package: pip install tensorboard "
                "(or pip install 'hvd_ngp[monitor]'); metrics.jsonl holds the same numbers"
            )
        has_tqdm = importlib.util.find_spec("tqdm") is not None
        if flags.progress == "on" and not has_tqdm:
            raise ConfigError("--progress on needs the 'tqdm' package: pip install tqdm")
        progress = has_tqdm and (flags.progress == "on" or (flags.progress == "auto" and sys.stderr.isatty()))
        jsonl = flags.metrics_jsonl if flags.metrics_jsonl is not None else str(Path(flags.out_dir) / "metrics.jsonl")
        return MonitorSettings(
            jsonl=Path(jsonl) if jsonl and jsonl.lower() != "none" else None,
            tensorboard=Path(flags.tensorboard) if flags.tensorboard else None,
            progress=progress,
            comm_timing=flags.comm_timing == "on",
            gpu_sample_period_s=flags.gpu_sample_period_s,
            append=bool(flags.load_snapshot or flags.resume),
        )


class Monitor:
    """Owns the log intervals: ``stats = new_interval()`` ... ``tick()`` per step ... ``end_interval(...)``;
    ``with paused():`` around evaluation keeps its collectives and GPU samples out of the interval.

    Construction does no collective (wrap it in ``dist.agree``); ``end_interval`` is one collective
    that every rank calls at the same step. ``gpu`` replaces the NVML sampler (tests).
    """

    def __init__(
        self,
        settings: MonitorSettings,
        total_steps: int,
        start_step: int = 0,
        gpu: GpuSampler | None = None,
        memory: MemoryMeter | None = None,
    ) -> None:
        self.rt = dist.runtime()
        self.memory = memory if memory is not None else MemoryMeter(self.rt.device)
        self.settings = settings
        COMM_CLOCK.enabled = settings.comm_timing
        self._comm_start = COMM_CLOCK.seconds
        self.gpu = gpu if gpu is not None else GpuSampler(self.rt.device, settings.gpu_sample_period_s)
        key = f"{socket.gethostname()}/{self.gpu.uuid}".encode()
        # a 48-bit identity of the physical GPU: exact in float64, so it travels in the reduced table
        self.gpu_id = float(int.from_bytes(hashlib.sha1(key).digest()[:6], "big")) if self.gpu.available else math.nan
        self.table: np.ndarray | None = None  # the last interval's reduced table [world_size, len(RANK_FIELDS)]
        self._jsonl: IO[str] | None = None
        self._tb: Any = None  # torch.utils.tensorboard.SummaryWriter under --tensorboard (optional package)
        self._bar = None
        if self.rt.is_root:
            self._open_sinks(total_steps, start_step)
        self.gpu.start()

    def _open_sinks(self, total_steps: int, start_step: int) -> None:
        s = self.settings
        if s.jsonl is not None:
            try:
                s.jsonl.parent.mkdir(parents=True, exist_ok=True)
                self._jsonl = s.jsonl.open("a" if s.append else "w", encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"{s.jsonl}: cannot write the metrics file: {exc.strerror}") from None
        if s.tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            try:
                self._tb = SummaryWriter(log_dir=str(s.tensorboard))
            except OSError as exc:
                raise ConfigError(f"{s.tensorboard}: cannot write TensorBoard logs: {exc.strerror}") from None
        if s.progress:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps if total_steps < UNLIMITED_STEPS else None,
                initial=start_step,
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=False,
            )

    def new_interval(self) -> IntervalStats:
        """Start an interval: fresh accumulators, comm clock and GPU samples from now on."""
        self._comm_start = COMM_CLOCK.seconds
        self.gpu.begin()
        return IntervalStats()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the block's collectives and GPU samples and energy out of the current interval
        (its wall time is left out by shifting ``IntervalStats.started``, as the training clock does)."""
        comm = COMM_CLOCK.seconds
        self.gpu.pause()
        try:
            yield
        finally:
            self.gpu.resume()
            self._comm_start += COMM_CLOCK.seconds - comm

    def tick(self) -> None:
        """One step done (moves the progress bar; nothing else)."""
        if self._bar is not None:
            self._bar.update(1)

    def local_row(self, stats: IntervalStats) -> torch.Tensor:
        """This rank's measurements over the interval ``[len(RANK_FIELDS)]`` (NaN: not measured)."""
        g = self.gpu.take()
        nan = math.nan
        mem = self.memory
        step = mem.read("step") if mem.active else None
        ev = mem.peaks.get("eval") if mem.active else None
        comm = COMM_CLOCK.seconds - self._comm_start if self.settings.comm_timing else nan
        values = {
            "steps": stats.steps,
            "rays": stats.rays,
            "samples": stats.samples,
            "loss_sum": float(stats.loss_sum),
            "mse_sum": float(stats.mse_sum),
            "seconds": time.perf_counter() - stats.started,
            "comm_seconds": comm,
            "gpu_util": g.util_pct,
            "gpu_mem_used": g.mem_used_bytes,
            "gpu_mem_total": g.mem_total_bytes,
            "gpu_power": g.power_w,
            "gpu_energy": g.energy_j,
            "gpu_id": self.gpu_id,
            "step_mem_allocated": step.allocated if step else None,
            "step_mem_reserved": step.reserved if step else None,
            "eval_mem_allocated": ev.allocated if ev else None,
            "eval_mem_reserved": ev.reserved if ev else None,
        }
        return torch.tensor([nan if (v := values[k]) is None else float(v) for k in RANK_FIELDS], dtype=torch.float64)

    def end_interval(
        self, step: int, stats: IntervalStats, train_s: float, occupancy: float | None = None
    ) -> dict[str, Any]:
        """Reduce the interval across ranks (ONE collective, every rank); rank 0 prints and records it.

        ``train_s``: training seconds so far (the training clock's reading), shown and recorded as is.
        Returns the record (keys: ``JSONL_FIELDS``) on every rank.
        """
        if self.rt.device.type == "cuda":
            torch.cuda.synchronize()  # once per interval: the interval's wall time includes its GPU work
        row = self.local_row(stats)
        self.table = gather_rows(row).numpy()  # every rank's row: the load balancer plans from it
        record = interval_record(self.table, step, train_s, occupancy)
        if self.rt.is_root:
            self._emit(record)
        return record

    def _emit(self, rec: dict[str, Any]) -> None:
        line = format_line(rec)
        if self._bar is not None:
            self._bar.set_postfix_str(
                f"{rec['samples_per_s'] / 1e6:.2f} M samples/s, loss {rec['loss']:.4f}", refresh=False
            )
            self._bar.write(line, file=sys.stderr)
        else:
            dist.log(line)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(rec) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for name, (_, tag) in JSONL_FIELDS.items():
                if tag is not None and rec[name] is not None:
                    self._tb.add_scalar(tag, rec[name], global_step=rec["step"], walltime=rec["time"])
            self._tb.flush()

    def close(self) -> None:
        """Stop the sampler and close the files (every rank; idempotent)."""
        self.gpu.close()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
