"""The step schedule: samples sit at ``t = T(F(t_near) + k + jitter)``, k = 0, 1, ...,
where the monotone "step coordinate" F makes consecutive samples ``dt_min`` apart near the camera,
``cone_angle * t`` apart further out (instant-ngp's exponential stepping for large scenes), and at
most ``dt_max`` apart. With ``cone_angle = 0`` the spacing is uniform. Because F has a closed-form
inverse, a marcher can jump over empty cells and land exactly on the next sample position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class StepSchedule:
    """Sample spacing along a ray (see the module docstring). Units: the scene's ngp space."""

    dt_min: float
    dt_max: float
    cone_angle: float = 0.0
    max_steps: int = 4096  # safety cap on lanes per ray
    near: float = 0.0  # marching starts this far from the ray origin

    def __post_init__(self) -> None:
        if not (self.dt_min > 0 and self.dt_max >= self.dt_min and self.cone_angle >= 0):
            raise ValueError(f"invalid step schedule {self}")

    @staticmethod
    def uniform(dt: float, max_steps: int = 4096) -> "StepSchedule":
        return StepSchedule(dt, dt, 0.0, max_steps)

    def _knots(self) -> tuple[float, float, float, float]:
        """t1, t2 (where spacing starts growing / stops growing) and their step coordinates s1, s2."""
        c = self.cone_angle
        t1, t2 = self.dt_min / c, self.dt_max / c
        s1 = t1 / self.dt_min
        return t1, t2, s1, s1 + math.log(t2 / t1) / math.log1p(c)

    def coord(self, t: Tensor) -> Tensor:
        """F(t): the step coordinate of distance t >= 0."""
        if self.cone_angle == 0:
            return t / self.dt_min
        t1, t2, s1, s2 = self._knots()
        lin = t / self.dt_min
        geo = s1 + torch.log(t.clamp(min=t1) / t1) / math.log1p(self.cone_angle)
        far = s2 + (t - t2) / self.dt_max
        return torch.where(t < t1, lin, torch.where(t < t2, geo, far))

    def time(self, s: Tensor) -> Tensor:
        """T(s) = F^-1(s): the distance at step coordinate s."""
        if self.cone_angle == 0:
            return s * self.dt_min
        t1, t2, s1, s2 = self._knots()
        lin = s * self.dt_min
        geo = t1 * torch.exp((s.clamp(s1, s2) - s1) * math.log1p(self.cone_angle))
        far = t2 + (s - s2) * self.dt_max
        return torch.where(s < s1, lin, torch.where(s < s2, geo, far))


@dataclass(frozen=True)
class MarchLaunch:
    """How the Triton march kernel is launched: ``block`` rays per program, ``segment`` lattice steps per
    program along a ray, ``warps`` per program (``block`` lanes fill ``block / 32`` warps; more warps hold
    copies of the same lanes). Powers of two. Every launch writes the same samples; only the speed differs
    (``bench throughput --march_launches`` times them side by side late in training). The defaults were the
    fastest there: one H200, lego, 2026-12-03, 0.63 -> 0.42 ms of march per step against 64 rays, 64 steps and
    4 warps (two of them copies), docs/BENCHMARKS.md."""

    block: int = 32
    segment: int = 32
    warps: int = 1

    def __post_init__(self) -> None:
        for name in ("block", "segment", "warps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"MarchLaunch.{name} must be a power of two >= 1, got {value!r}")
