"""Load balance across ranks, decided once per log interval from the monitor's reduced table.

Every rank receives the same ``[world_size, fields]`` table from ``Monitor.end_interval`` (one
collective it makes anyway), so every rank computes the same plan without communicating more.
A rank's "busy" time is its interval seconds minus the seconds it spent blocked in collectives
(waiting for the others): its own work.

- ``off``: every rank takes the same number of rays per step (re-planned each interval so that
  the ranks together reach ``target_samples`` per rank on average): the naive baseline. Each rank's
  sample capacity (the fast path's fixed network buffers, ``sample_capacity``) is what those rays
  gave it last interval plus ``OFF_HEADROOM``: the rank whose rays march more samples works longer,
  as it would without balancing, and no rank pads its buffers to the worst case.
- ``samples`` (default): each rank sizes its ray batch every step to reach ``target_samples``
  (``RayBudget``); deterministic, so runs and resumed runs repeat bit for bit on the CPU.
- ``time``: as ``samples``, and when the per-rank step times drift apart by more than
  ``threshold`` (``(max - min) / max``), each rank's sample target becomes proportional to its
  measured throughput (samples per busy second), so slower ranks get less work. Targets are
  smoothed (geometric mean with the previous plan), kept within [0.25, 2] x ``target_samples`` and
  sum to ``world_size x target_samples``: the job's samples per step stay the same.

With unequal batches, each rank's loss is scaled by ``world_size * rays_r / sum(rays)`` (from the
last interval), so Horovod's average of the ranks' gradients is the gradient of the mean over all
rays of the step instead of over-weighting the rays of small batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

MODES = ("off", "samples", "time")
MIN_SHARE, MAX_SHARE = 0.25, 2.0
OFF_HEADROOM = 1.15  # --balance off: sample capacity over the samples the equal rays gave last interval


def check_options(mode: str, threshold: float) -> None:
    """``--balance`` and ``--balance_threshold``; a bad value is a ``ConfigError`` saying what was expected."""
    if mode not in MODES:
        raise ConfigError(f"--balance must be one of {', '.join(MODES)}, got {mode!r}")
    if not 0 <= threshold < 1:
        raise ConfigError(f"--balance_threshold must be in [0, 1), got {threshold}")


@dataclass(frozen=True)
class RankTimes:
    """Per-rank figures of one interval, ``[world_size]`` each: busy seconds per step, rays and samples per step."""

    busy_per_step: np.ndarray
    rays_per_step: np.ndarray
    samples_per_step: np.ndarray

    @staticmethod
    def from_table(table: np.ndarray, col: dict[str, int]) -> "RankTimes":
        """From the monitor's reduced table (columns named by ``observe.metrics.COL``)."""
        steps = np.maximum(table[:, col["steps"]], 1.0)
        comm = np.nan_to_num(table[:, col["comm_seconds"]], nan=0.0)
        busy = np.maximum(table[:, col["seconds"]] - comm, 1e-9)
        return RankTimes(busy / steps, table[:, col["rays"]] / steps, table[:, col["samples"]] / steps)

    def spread(self) -> float:
        """``(max - min) / max`` of the per-rank busy time per step: 0 balanced, 1 a rank idles throughout."""
        hi = float(self.busy_per_step.max())
        return (hi - float(self.busy_per_step.min())) / hi if hi > 0 else 0.0


class Balancer:
    """This rank's share of the work. ``update(times)`` after each interval; read ``target_samples``,
    ``equal_rays`` (mode off) and ``loss_scale``."""

    def __init__(
        self,
        mode: str,
        rank: int,
        world_size: int,
        target_samples: int,
        threshold: float = 0.05,
        max_rays: int = 1 << 20,
    ) -> None:
        check_options(mode, threshold)
        self.mode, self.rank, self.world_size = mode, rank, world_size
        self.target = int(target_samples)
        self.threshold = threshold
        self.max_rays = max_rays
        self.shares = np.ones(world_size)  # sample targets / target_samples, per rank
        self.equal_rays: int | None = None
        self.off_capacity: int | None = None  # --balance off: this rank's sample capacity
        self.loss_scale = 1.0
        self.rebalances = 0
        self.last_spread: float | None = None

    @property
    def target_samples(self) -> int:
        """This rank's samples per step."""
        return max(int(round(self.target * self.shares[self.rank])), 1)

    @property
    def sample_capacity(self) -> int:
        """Room for this rank's samples per step: its target, or under ``off`` what its equal rays need
        (``MAX_SHARE`` x the target before the first plan)."""
        if self.mode == "off":
            return self.off_capacity or int(MAX_SHARE * self.target)
        return self.target_samples

    def update(self, times: RankTimes) -> bool:
        """Plan the next interval from the last one's ``times``; True when the time plan changed. An interval
        in which no rank counted a ray or a sample (the first log after a resume: its only step is the
        uncounted warm-up) keeps the plan as it was: zero samples per ray would ask for ``max_rays``."""
        self.last_spread = times.spread()
        rays = times.rays_per_step
        if rays.sum() <= 0 or times.samples_per_step.sum() <= 0:
            return False
        if self.world_size > 1 and self.mode != "off":
            self.loss_scale = float(self.world_size * rays[self.rank] / rays.sum())
        if self.mode == "off":
            per_ray = times.samples_per_step.sum() / max(rays.sum(), 1.0)
            n = self.target / max(per_ray, 1e-6)
            self.equal_rays = int(min(max(n, 64), self.max_rays)) // 64 * 64
            mine = OFF_HEADROOM * self.equal_rays * times.samples_per_step[self.rank] / max(rays[self.rank], 1.0)
            self.off_capacity = int(np.clip(mine, MIN_SHARE * self.target, MAX_SHARE * self.target))
            return False
        if self.mode != "time" or self.world_size == 1 or self.last_spread <= self.threshold:
            return False
        rate = times.samples_per_step / times.busy_per_step  # samples per busy second
        if not np.all(np.isfinite(rate)) or rate.sum() <= 0:
            return False
        plan = self.world_size * rate / rate.sum()
        shares = np.sqrt(self.shares * plan)  # smoothed
        for _ in range(4):  # clamp, then renormalise to a mean of 1
            shares = np.clip(shares, MIN_SHARE, MAX_SHARE)
            shares *= self.world_size / shares.sum()
        self.shares = np.clip(shares, MIN_SHARE, MAX_SHARE)
        self.rebalances += 1
        return True

    def describe(self) -> str:
        return ", ".join(f"{s:.2f}" for s in self.shares)

    def state_dict(self) -> dict:
        return {
            "shares": self.shares.tolist(),
            "equal_rays": self.equal_rays,
            "loss_scale": self.loss_scale,
            "off_capacity": self.off_capacity,
        }

    def load_state_dict(self, state: dict) -> None:
        if len(state["shares"]) == self.world_size:  # a new world size starts balanced
            self.shares = np.asarray(state["shares"], dtype=np.float64)
            self.loss_scale = float(state["loss_scale"])
            self.off_capacity = state.get("off_capacity")  # absent in checkpoints before it existed
        self.equal_rays = state["equal_rays"]
