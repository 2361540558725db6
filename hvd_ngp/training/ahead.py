"""Drawing the next step's rays while the GPU runs this one (``--draw_ahead on``, graphed steps only).

The graphed step waits once per step for its gradient allreduce (and, with ``--defer_verdict off``, its
non-finite flags; ``training.graphed``). Without this, the host draws a step's rays (pixels, ray origins
and directions, background and jitter: a few launches with the fused draw, dozens without) only after that
wait, while the GPU has nothing queued. With it, the trainer
draws step k+1's batch right after launching graph A of step k and starting its gradient allreduce,
so those launches overlap the GPU's work and (on several ranks) the allreduce; then it waits for
the allreduce and the flags.

A batch drawn ahead is used only if nothing that shapes it changed in between: the step, the ray count,
the sampler (object and ``version``: shard, scores, resolution) and the background generator. Otherwise
it is un-drawn (both generators set back to their states from before it) and drawn again, so the rays
are the ones a run without drawing ahead would use. The same happens before a checkpoint reads the
random streams (``TrainState.before_pack``), so checkpoints and resumes are exact.

The ray count then changes only at the point where the next batch is drawn (``RayBudget.settle``
there, ``RayBudget.update(apply=False)`` after the step): it follows the sample counts of the step
before the current one, as it does without drawing ahead once the GPU is the bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..data.sampler import RayBatch, RaySampler


@dataclass
class Draw:
    """One step's training input: ``rays`` (R rays), ``background`` ``[R, 3]`` (an expanded view when
    constant), sub-step ``jitter`` ``[R]``."""

    rays: RayBatch
    background: Tensor
    jitter: Tensor


@dataclass
class _Ahead:
    step: int
    n_rays: int
    sampler: RaySampler
    version: int
    bg_gen: torch.Generator
    states: tuple[Tensor, Tensor]  # the sampler's and the background generator's states before the draw
    draw: Draw


class DrawAhead:
    """At most one batch drawn for a later step, and how to un-draw it. ``used`` / ``redrawn`` count the
    batches taken as drawn and the ones drawn again (for the log and the tests)."""

    def __init__(self) -> None:
        self._ahead: _Ahead | None = None
        self.used = 0
        self.redrawn = 0

    def put(
        self, step: int, n_rays: int, sampler: RaySampler, bg_gen: torch.Generator, draw: Callable[[int], Draw]
    ) -> None:
        """Draw ``n_rays`` rays for ``step`` now (``draw(n_rays)``), remembering the generators' states."""
        self.rewind()
        states = (sampler.generator.get_state(), bg_gen.get_state())
        self._ahead = _Ahead(step, n_rays, sampler, sampler.version, bg_gen, states, draw(n_rays))

    def take(self, step: int, n_rays: int, sampler: RaySampler, bg_gen: torch.Generator) -> Draw | None:
        """The batch drawn ahead for exactly this step, ray count, sampler state and generator; else None
        (a stale batch is un-drawn first, so the caller's fresh draw repeats its random numbers)."""
        ahead = self._ahead
        if ahead is None:
            return None
        if (
            (ahead.step, ahead.n_rays, ahead.version) == (step, n_rays, sampler.version)
            and ahead.sampler is sampler
            and ahead.bg_gen is bg_gen
        ):
            self._ahead = None
            self.used += 1
            return ahead.draw
        self.rewind()
        self.redrawn += 1
        return None

    def rewind(self) -> None:
        """Un-draw the batch held, if any: its generators go back to their states from before it."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.sampler.generator.set_state(ahead.states[0])
            ahead.bg_gen.set_state(ahead.states[1])


__all__ = ["Draw", "DrawAhead"]
