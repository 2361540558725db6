"""Per-stage timing of a training step with CUDA events (or wall clock on the CPU).

``timer.mark("march")`` closes the stage that began at the previous mark. Events are only read at
``collect()``, so marking adds no host synchronisation. ``NULL_TIMER`` is the do-nothing default
that the training code uses outside benchmarks.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch


class StageTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, Any]] = []  # (stage, CUDA event or perf_counter seconds)
        self.totals: dict[str, float] = defaultdict(float)  # ms, summed over collected steps
        self.steps = 0

    def _now(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        self._marks = [("", self._now())]

    def mark(self, stage: str) -> None:
        if self._marks:
            self._marks.append((stage, self._now()))

    def collect(self) -> None:
        """Add the finished step's stage times to ``totals`` (synchronises the device)."""
        if len(self._marks) < 2:
            return
        if self.cuda:
            torch.cuda.synchronize()
        for (_, a), (stage, b) in zip(self._marks, self._marks[1:]):
            self.totals[stage] += a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        self.steps += 1
        self._marks = []

    def mean_ms(self) -> dict[str, float]:
        return {k: v / max(self.steps, 1) for k, v in self.totals.items()}


class _NullTimer(StageTimer):
    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))

    def start(self) -> None:
        pass

    def mark(self, stage: str) -> None:
        pass


NULL_TIMER = _NullTimer()
