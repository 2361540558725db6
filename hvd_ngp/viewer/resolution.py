"""How large and how often the viewer renders: the frame size that keeps a frame under its time budget,
and the share of the wall time frames may take during training."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class AdaptiveResolution:
    """The longer image side of the next frame, so that a frame takes at most ``budget_s``.

    A frame's time grows with its pixel count, so the side that fits the budget is the last side times
    ``sqrt(budget_s / last time)``; ``headroom`` (< 1) aims a little below the budget. The side grows by
    at most ``grow`` per frame (a frame that overruns costs one frame only) and shrinks at once.
    """

    budget_s: float
    min_side: int = 32
    max_side: int = 1920
    side: int = 64  # the next frame's longer side
    grow: float = 1.25
    headroom: float = 0.85

    def __post_init__(self) -> None:
        if self.budget_s <= 0 or not 0 < self.min_side <= self.max_side:
            raise ValueError(
                f"frame budget must be > 0 and 0 < min_side <= max_side, got {self.budget_s}, "
                f"{self.min_side}, {self.max_side}"
            )
        self.side = min(max(self.side, self.min_side), self.max_side)

    def update(self, frame_s: float, limit: int | None = None) -> int:
        """After a frame of ``self.side`` that took ``frame_s`` seconds: the next side, at most ``limit`` (the
        viewer's canvas) and ``max_side``."""
        ratio = math.sqrt(self.headroom * self.budget_s / max(frame_s, 1e-6))
        side = self.side * min(ratio, self.grow)
        top = self.max_side if limit is None else max(self.min_side, min(self.max_side, int(limit)))
        self.side = int(min(max(round(side), self.min_side), top))
        return self.side


def frame_size(side: int, aspect: float) -> tuple[int, int]:
    """(width, height) of a frame whose longer side is ``side`` pixels at ``aspect`` = width / height."""
    if aspect >= 1:
        return side, max(1, round(side / aspect))
    return max(1, round(side * aspect)), side


class FrameThrottle:
    """Frames during training take at most ``share`` of the wall time: after a frame that took ``t`` seconds
    the next one waits ``t * (1 - share) / share`` seconds. ``clock``: seconds (injectable for tests)."""

    def __init__(self, share: float, clock: Callable[[], float] = time.perf_counter) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"the viewer's share of the time must be in (0, 1], got {share}")
        self.share, self.clock = share, clock
        self.next_at = -math.inf

    def due(self) -> bool:
        return self.clock() >= self.next_at

    def took(self, start: float, end: float) -> None:
        """A frame ran from ``start`` to ``end`` (``clock`` readings)."""
        self.next_at = end + (end - start) * (1 - self.share) / self.share
