"""Training-time clock: wall time spent training, excluding evaluation and other pauses.

On a GPU the clock synchronises the device when read, so queued work is counted where it ran.
``shared_seconds`` is a collective that gives every rank the same reading (the slowest rank's),
so decisions taken from it (time budget, evaluation times) are identical everywhere.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch

from ..cluster import dist


class TrainClock:
    def __init__(self, device: torch.device, already: float = 0.0) -> None:
        """``already``: training seconds spent before this process (a resumed run continues its clock)."""
        self.device = device
        self._banked = float(already)
        self._since: float | None = time.perf_counter()
        self.last_pause = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def seconds(self) -> float:
        """Training seconds so far on this rank."""
        self._sync()
        running = time.perf_counter() - self._since if self._since is not None else 0.0
        return self._banked + running

    @contextmanager
    def paused(self) -> Iterator["TrainClock"]:
        """Time inside the block does not count; ``last_pause`` holds its length afterwards."""
        self._sync()
        now = time.perf_counter()
        assert self._since is not None, "TrainClock.paused does not nest"
        self._banked += now - self._since
        self._since = None
        try:
            yield self
        finally:
            self._sync()
            self._since = time.perf_counter()
            self.last_pause = self._since - now

    def shared_seconds(self) -> float:
        """The slowest rank's training seconds, on every rank (collective)."""
        return float(dist.allreduce(torch.tensor([self.seconds()], dtype=torch.float64), "max", name="clock")[0])
