"""Image metrics and training-throughput bookkeeping (reduced across ranks once per log interval)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from . import dist


def mse_to_psnr(mse: float) -> float:
    """PSNR in dB of images in [0, 1]."""
    return float("inf") if mse <= 0 else -10.0 * math.log10(mse)


def psnr(a: Tensor, b: Tensor) -> float:
    return mse_to_psnr(float(torch.mean((a.float() - b.float()) ** 2)))


@dataclass
class IntervalStats:
    """Per-rank sums over one log interval; ``reduce()`` is one allreduce, called by every rank."""

    loss_sum: Tensor | float = 0.0  # stays on the device until the interval ends: no sync per step
    mse_sum: Tensor | float = 0.0
    steps: int = 0
    rays: int = 0
    samples: int = 0
    candidates: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, loss: Tensor, mse: Tensor, rays: int, samples: int, candidates: int) -> None:
        self.loss_sum = self.loss_sum + loss.detach()
        self.mse_sum = self.mse_sum + mse.detach()
        self.steps += 1
        self.rays += rays
        self.samples += samples
        self.candidates += candidates

    def reduce(self, device: torch.device) -> dict:
        """Across ranks: totals of rays/samples, mean loss/mse, the slowest rank's wall time."""
        elapsed = time.perf_counter() - self.started
        v = torch.tensor([float(self.loss_sum), float(self.mse_sum), self.steps, self.rays, self.samples, self.candidates, elapsed],
                         dtype=torch.float64)
        total = dist.allreduce(v, "sum", name="metrics.interval")
        slowest = dist.allreduce(v[6:7].clone(), "max", name="metrics.interval_time")
        rt = dist.runtime()
        steps = max(self.steps, 1)
        return {
            "loss": float(total[0]) / rt.size / steps,
            "mse": float(total[1]) / rt.size / steps,
            "rays_per_step": float(total[3]) / steps,
            "samples_per_step": float(total[4]) / steps,
            "samples": float(total[4]),
            "candidates": float(total[5]),
            "seconds": float(slowest[0]),
        }
