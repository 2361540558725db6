"""instant-ngp style error map: the training loss per tile, accumulated on the device, reduced every N steps.

Every step ``record`` adds each ray's loss (mean over colour channels, as instant-ngp deposits it)
to its tile's sum and count with ``index_add_``: device tensors only, no host synchronisation.
Every ``interval`` steps ``reduce`` (a collective, every rank at the same step) sums the
accumulators over ranks and blends each sampled tile's mean loss into the map,
``error = decay * error + (1 - decay) * mean``; tiles nobody sampled keep their value, and before a
tile's first sample it holds the mean of the sampled ones. Dividing by the count makes the map an
estimate of each tile's mean loss whatever the sampling distribution was (instant-ngp divides each
deposit by its sampling pdf for the same reason).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..cluster import dist


class ErrorMap:
    """Per-tile loss: ``error`` ``[T]`` float64 on the CPU after each ``reduce``; accumulators on ``device``."""

    def __init__(self, n_tiles: int, device: torch.device, decay: float = 0.5) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"error map decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.acc = torch.zeros(2, n_tiles, dtype=torch.float32, device=device)  # loss sums, counts
        self.error = torch.ones(n_tiles, dtype=torch.float64)
        self.seen = torch.zeros(n_tiles, dtype=torch.bool)
        self.updates = 0

    def record(self, tile: Tensor, loss: Tensor, valid: Tensor | None = None) -> None:
        """tile ``[R]`` int64 tile ids, loss ``[R]`` per-ray loss, valid ``[R]`` bool (rays left out of the loss) or None."""
        w = torch.ones_like(loss, dtype=torch.float32) if valid is None else valid.to(torch.float32)
        vals = torch.stack([loss.detach().float() * w, w])
        self.acc.index_add_(1, tile.to(self.acc.device), vals)

    def reduce(self) -> Tensor:
        """Sum the accumulators over ranks and update the map (collective); returns ``error`` ``[T]``."""
        acc = dist.allreduce(self.acc.double(), "sum", name="sampling.error_map").cpu()
        self.acc.zero_()
        sums, counts = acc[0], acc[1]
        hit = counts > 0
        if bool(hit.any()):
            tile_mean = sums / counts.clamp(min=1.0)  # [T]; meaningful where hit
            fresh = hit & ~self.seen
            old = hit & self.seen
            self.error[fresh] = tile_mean[fresh]
            self.error[old] = self.decay * self.error[old] + (1.0 - self.decay) * tile_mean[old]
            self.seen |= hit
            self.error[~self.seen] = float(tile_mean[hit].mean())
        self.updates += 1
        return self.error

    def state_dict(self) -> dict:
        """JSON-able (checkpoints keep it in the run's progress record)."""
        return {"error": self.error.tolist(), "seen": self.seen.tolist(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.error.copy_(torch.as_tensor(state["error"], dtype=torch.float64))
        self.seen.copy_(torch.as_tensor(state["seen"], dtype=torch.bool))
        self.updates = int(state["updates"])
