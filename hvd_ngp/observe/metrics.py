"""Image metrics and training-throughput bookkeeping (gathered across ranks once per log interval by
``observe.monitor``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

#: one rank's measurements over one interval: the columns of the reduced table
RANK_FIELDS = (
    "steps",
    "rays",
    "samples",
    "loss_sum",
    "mse_sum",
    "seconds",
    "comm_seconds",
    "gpu_util",
    "gpu_mem_used",
    "gpu_mem_total",
    "gpu_power",
    "gpu_energy",
    "gpu_id",
    "step_mem_allocated",
    "step_mem_reserved",
    "eval_mem_allocated",
    "eval_mem_reserved",
)
COL = {name: i for i, name in enumerate(RANK_FIELDS)}

#: --time_budget_s without --n_steps: the budget ends training (config's default, the monitor's "no total")
UNLIMITED_STEPS = 10**12


def mse_to_psnr(mse: float) -> float:
    """PSNR in dB of images in [0, 1]."""
    return float("inf") if mse <= 0 else -10.0 * math.log10(mse)


def srgb_to_linear(x: Tensor) -> Tensor:
    """sRGB-encoded values (any shape) -> linear light."""
    return torch.where(x > 0.04045, ((x + 0.055) / 1.055) ** 2.4, x / 12.92)


def linear_to_srgb(x: Tensor) -> Tensor:
    """Linear light (any shape, >= 0) -> sRGB-encoded values."""
    return torch.where(x > 0.0031308, 1.055 * x.clamp(min=0.0031308) ** (1 / 2.4) - 0.055, 12.92 * x)


@dataclass
class IntervalStats:
    """Per-rank sums over one log interval (``observe.monitor.Monitor`` gathers them at the interval's end)."""

    loss_sum: Tensor | float = 0.0  # stays on the device until the interval ends: no sync per step
    mse_sum: Tensor | float = 0.0
    steps: int = 0
    rays: int = 0
    samples: int | Tensor = 0  # device scalars on the fast path: summed on the device
    started: float = field(default_factory=time.perf_counter)

    def add(self, loss: Tensor, mse: Tensor, rays: int, samples: int | Tensor) -> None:
        self.loss_sum = self.loss_sum + loss.detach()
        self.mse_sum = self.mse_sum + mse.detach()
        self.steps += 1
        self.rays += rays
        self.samples += samples


def _gaussian_window(size: int = 11, sigma: float = 1.5, device=None) -> Tensor:
    x = torch.arange(size, dtype=torch.float32, device=device) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return g[:, None] * g[None, :]


def ssim(a: Tensor, b: Tensor) -> float:
    """Structural similarity of two images ``[H, W, C]`` in [0, 1] (Wang et al. 2004: 11x11 Gaussian
    window, sigma 1.5, K1 0.01, K2 0.03, mean over the valid region and the channels)."""
    c = a.shape[-1]
    x = a.float().permute(2, 0, 1)[None]
    y = b.float().permute(2, 0, 1)[None]
    w = _gaussian_window(device=a.device).expand(c, 1, 11, 11)

    def blur(t: Tensor) -> Tensor:
        return torch.nn.functional.conv2d(t, w, groups=c)

    mx, my = blur(x), blur(y)
    sxx = blur(x * x) - mx * mx
    syy = blur(y * y) - my * my
    sxy = blur(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return float(s.mean())
