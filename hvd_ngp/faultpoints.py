"""The fault registry: the few points where the product lets test-only faults in.

The training step and the checkpoint writer call these. Unarmed (``HVD_NGP_FAULTS`` unset, always
outside tests) each is one environment lookup and returns at once; ``hvd_ngp.testing`` is never
imported. Armed, each forwards to ``hvd_ngp.testing.faults``, which parses the variable and acts.
This module is the only product module that may import ``hvd_ngp.testing`` (an import-linter
contract in setup.cfg holds that).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import torch

ENV = "HVD_NGP_FAULTS"  # = testing.faults.ENV (defined twice so that testing never imports back; a test checks)


def _armed():
    """``hvd_ngp.testing.faults`` when faults are armed, else None (nothing imported)."""
    if ENV not in os.environ:
        return None
    from .testing import faults

    return faults


def at_step(step: int) -> None:
    """Process-level step faults (raise, exit, kill, hang) armed for this rank at ``step`` (1-based)."""
    faults = _armed()
    if faults is not None:
        faults.at_step(step)


def slow_down(step: int, n_samples) -> None:
    """A ``slow`` fault: sleep in proportion to the step's samples."""
    faults = _armed()
    if faults is not None:
        faults.slow_down(step, n_samples)


def poison_loss(loss: torch.Tensor, step: int) -> torch.Tensor:
    """``loss`` (a scalar), or ``loss * NaN`` under a ``nan_loss`` fault for this rank at ``step``."""
    faults = _armed()
    return loss if faults is None else faults.poison_loss(loss, step)


def checkpoint_stream(f: BinaryIO, path: str) -> BinaryIO:
    """``f``, or a failing/stalling wrapper under a checkpoint-write fault."""
    faults = _armed()
    return f if faults is None else faults.checkpoint_stream(f, path)


def render_chunk() -> None:
    """A ``slow_render`` fault: sleep before this render chunk (a long evaluation, for stop tests)."""
    faults = _armed()
    if faults is not None:
        faults.render_chunk()
