"""Rank 0's live view of a training run (``--viewer PORT``): the ``training.control.Watcher`` the run loop
calls between steps.

Frames render on the training thread between steps with the current weights (every rank holds the same
after the allreduce): on a GPU in a side stream, after the step's work. A frame takes at most the frame
budget (its size adapts), and frames take at most ``share`` of the wall time (``FrameThrottle``), so
training slows by about ``share`` at most while a browser is connected, and not at all without one.
The buttons only set flags here; ``training.control.RunControl`` carries them to every rank.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ..cluster import dist
from ..model.encoding import FAST_RENDERER_BACKENDS
from .resolution import FrameThrottle
from .server import ViewedModel, Viewer

if TYPE_CHECKING:
    from ..training.trainer import Trainer

GRID_EVERY_S = 5.0  # the occupancy points are redrawn this often (seconds) while browsers watch


class LiveViewer:
    """Serves ``tr``'s field on ``host:port``; see the module docstring."""

    def __init__(self, tr: "Trainer", host: str, port: int, budget_s: float, share: float) -> None:
        model = ViewedModel(
            tr.field,
            tr.grid,
            tr.march,
            tr.scene,
            tr.eval_settings.eval_background,
            fast=tr.backend in FAST_RENDERER_BACKENDS and tr.mp is None,
            memory=tr.memory,
        )
        self.lock = threading.Lock()
        self.paused, self.saves = False, 0
        self.step = tr.state.step
        self.viewer = Viewer(
            model, host, port, budget_s, live=True, title="hvd_ngp training", on_pause=self._pause, on_save=self._save
        )
        self.throttle = FrameThrottle(share)
        self.grid_drawn = time.monotonic()
        self.frame_note = ""
        self._status()
        dist.log(self.viewer.describe())

    # --------------------------------------------------------------- the buttons (viser's thread)

    def _pause(self, paused: bool) -> None:
        with self.lock:
            self.paused = paused
        self._status()

    def _save(self) -> None:
        with self.lock:
            self.saves += 1
        self.viewer.status(f"step {self.step}: saving a checkpoint ...")

    # --------------------------------------------------------------- control.Watcher

    def pending(self) -> tuple[bool, bool]:
        with self.lock:
            asked = self.paused, self.saves > 0
            self.saves = 0
        return asked

    def after_step(self, step: int) -> None:
        self.step = step
        self._frame()

    def idle(self) -> None:
        self._frame()

    def record(self, step: int, values: dict[str, float]) -> None:
        self.viewer.record(step, values)
        self._status()

    def close(self) -> None:
        self.viewer.close()

    # ---------------------------------------------------------------

    def _frame(self) -> None:
        if not self.throttle.due() or not self.viewer.clients():
            return
        started = time.perf_counter()
        if time.monotonic() - self.grid_drawn >= GRID_EVERY_S:
            self.viewer.update_grid()
            self.grid_drawn = time.monotonic()
        if self.viewer.draw():
            last = max(self.viewer.frames.values(), key=lambda f: f.seconds)
            self.frame_note = f"frame {last.side} px (longer side) in {1000 * last.seconds:.0f} ms"
            self.throttle.took(started, time.perf_counter())
            self._status()

    def _status(self) -> None:
        h = self.viewer.history
        parts = [f"**step {self.step}**" + (" (paused)" if self.paused else "")]
        if h["train_psnr"]:
            parts.append(f"train PSNR {h['train_psnr'][-1][1]:.2f} dB")
        if h["test_psnr"]:
            parts.append(f"test PSNR {h['test_psnr'][-1][1]:.2f} dB")
        if self.frame_note:
            parts.append(self.frame_note)
        self.viewer.status("  \n".join(parts))
