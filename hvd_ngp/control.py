"""Wall-clock decisions that every rank must take at the same step.

"Stop: the time budget is spent" and "write a checkpoint: M minutes have passed" are read from
rank 0's clock, but act collectively (the loop ends, a checkpoint gathers every rank's state),
so every ``interval`` steps all ranks run one small Max-allreduce of rank 0's verdicts. Nothing
is communicated when neither feature is on (the same on every rank, it depends on flags only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from . import dist


@dataclass(frozen=True)
class Verdict:
    stop: bool = False
    checkpoint: bool = False


class RunClock:
    """Rank 0's clock, agreed every ``interval`` steps."""

    def __init__(self, time_budget_s: float = 0.0, checkpoint_minutes: float = 0.0, interval: int = 8) -> None:
        self.time_budget_s, self.checkpoint_minutes, self.interval = time_budget_s, checkpoint_minutes, interval
        self.started = time.perf_counter()
        self.last_checkpoint = time.perf_counter()

    @property
    def enabled(self) -> bool:
        return self.time_budget_s > 0 or self.checkpoint_minutes > 0

    def checkpointed(self) -> None:
        """A checkpoint was just written (by any trigger): the minutes count from now."""
        self.last_checkpoint = time.perf_counter()

    def poll(self, step: int) -> Verdict:
        """Collective on the steps where ``step % interval == 0`` (when enabled); a no-op otherwise."""
        if not self.enabled or step % self.interval:
            return Verdict()
        now = time.perf_counter()
        mine = torch.zeros(2)
        if dist.runtime().is_root:
            mine[0] = float(self.time_budget_s > 0 and now - self.started > self.time_budget_s)
            mine[1] = float(self.checkpoint_minutes > 0 and now - self.last_checkpoint >= 60.0 * self.checkpoint_minutes)
        agreed = dist.allreduce(mine, "max", name="control.clock")
        return Verdict(stop=bool(agreed[0] > 0), checkpoint=bool(agreed[1] > 0))
