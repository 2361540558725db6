"""Pause, resume and save requests made on rank 0 (the web viewer's buttons), agreed by every rank.

Only rank 0 serves the viewer, so only rank 0 knows what its user asked. Every ``every`` steps all ranks
run one tiny allreduce (max) of ``[pause, save, stop]``: rank 0 puts in the viewer's pause state and
whether a save was asked since the last poll, every rank its pending stop signal. Every rank then acts
the same way after the same step. While paused, the ranks poll again every ``poll_s`` seconds (rank 0's
viewer keeps drawing in between) until rank 0 resumes, asks for a save, or a stop signal arrives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..cluster import dist

EVERY_STEPS = 8
POLL_S = 0.1


@dataclass
class Requests:
    """What every rank agreed to do now."""

    pause: bool = False
    save: bool = False
    stop: bool = False  # a stop signal is pending on some rank: leave a pause so the run loop can obey it


class Watcher(Protocol):
    """Rank 0's live view of a training run (``hvd_ngp.viewer.LiveViewer``): it draws between steps and is
    the source of the requests."""

    def pending(self) -> tuple[bool, bool]:
        """(pause wanted, a save asked since the last call)."""

    def idle(self) -> None:
        """While training is paused, between polls (draw)."""

    def after_step(self, step: int) -> None:
        """Between steps (draw when a frame is due)."""

    def record(self, step: int, values: dict[str, float]) -> None:
        """Numbers to plot (loss, train PSNR, test PSNR) at ``step``."""

    def close(self) -> None: ...


class RunControl:
    """Every rank holds one (the same ``every``); rank 0 passes its ``source``, the others None.
    ``stop_pending``: this rank received a stop signal (``preempt.StopVote.local``)."""

    def __init__(
        self,
        source: Watcher | None,
        stop_pending: Callable[[], bool] = lambda: False,
        every: int = EVERY_STEPS,
        poll_s: float = POLL_S,
    ) -> None:
        if every < 1:
            raise ValueError(f"requests must be polled every >= 1 steps, got {every}")
        self.source, self.stop_pending, self.every, self.poll_s = source, stop_pending, every, poll_s

    def poll(self, step: int) -> Requests | None:
        """Collective on every ``every``-th step: the agreed requests; None on other steps."""
        return self.agree() if step % self.every == 0 else None

    def agree(self) -> Requests:
        """Collective: rank 0's pause and save, any rank's stop."""
        pause, save = self.source.pending() if self.source is not None else (False, False)
        flags = torch.tensor([float(pause), float(save), float(self.stop_pending())])
        if dist.runtime().size > 1:
            flags = dist.allreduce(flags, "max", name="control.requests")
        return Requests(*(bool(v > 0) for v in flags.tolist()))

    def wait(self) -> Requests:
        """Collective, while paused: poll until rank 0 resumes or asks for a save, or a stop is pending."""
        while True:
            deadline = time.monotonic() + self.poll_s
            while True:  # the same pace on every rank; rank 0 draws meanwhile
                if self.source is not None:
                    self.source.idle()
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(left, 0.02))
            asked = self.agree()
            if asked.save or asked.stop or not asked.pause:
                return asked
