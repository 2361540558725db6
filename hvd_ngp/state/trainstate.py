"""Everything that decides the rest of a run's trajectory, in one object.

Shared by all ranks (identical everywhere): the field, the occupancy grid, the optimizer (and the
fp16 gradient scaler), the parameter average (``optim.ParameterEma``, with an ``Ema`` block), the step,
the gradient average still in flight (``--grad_sync delayed``). Per rank (each rank's own): the ray sampler (its pixel shard and
its generator), the background/jitter generator, the torch global generators, the adaptive ray
count. Checkpoints save both kinds (the per-rank kind gathered to rank 0, see ``checkpoint``);
elastic training rebuilds the per-rank kind when the world changes (``reseed``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch
from torch import Tensor

from ..data.sampler import RaySampler
from ..data.scene import Frames

if TYPE_CHECKING:
    from ..render.occupancy import OccupancyGrid

#: stride between the random streams of successive (re)seedings, so a reseed at step s never
#: replays the stream a rank started with at step 0
_STEP_STRIDE = 1_000_003


def background_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s background/jitter generator at step 0."""
    return seed * 7919 + rank


def make_rank_streams(
    frames: Frames,
    seed: int,
    rank: int,
    size: int,
    device: torch.device,
    step: int = 0,
    new_sampler: NewSampler | None = None,
) -> tuple[RaySampler, torch.Generator]:
    """This rank's ray sampler (shard ``rank`` of ``size``) and background generator, seeded for ``step``.

    At step 0 the seeds are the trainer's historical ones (``seed + rank``, ``seed * 7919 + rank``);
    a reseed at a later step (world-size change, resume on another world size) shifts both.
    ``new_sampler(rank, size, seed)`` makes the sampler (the trainer's data pipeline; default: a plain
    ``RaySampler`` with all images on ``device``).
    """
    shift = step * _STEP_STRIDE
    sampler = (
        new_sampler(rank, size, seed + shift)
        if new_sampler is not None
        else RaySampler(frames, rank, size, seed + shift, device)
    )
    bg_gen = torch.Generator(device=device)
    bg_gen.manual_seed((background_seed(seed, rank) + shift) % (2**63))
    return sampler, bg_gen


class NewSampler(Protocol):
    """Makes the ray sampler of shard ``rank`` of ``size`` drawing with ``seed`` (``DataPipeline.new_sampler``)."""

    def __call__(self, rank: int, size: int, seed: int) -> RaySampler: ...


class RayCount(Protocol):
    """This rank's adaptive ray count (``training.budget.RayBudget``; ``settle()`` applies counts still in flight)."""

    n_rays: int


@dataclass
class TrainState:
    """A run's state. ``progress`` holds the run's bookkeeping (history, seconds, samples; JSON-able)
    that a resume continues."""

    field: torch.nn.Module
    grid: OccupancyGrid
    optimizer: torch.optim.Optimizer
    scaler: Any  # torch.amp.GradScaler | None
    sampler: RaySampler
    bg_gen: torch.Generator
    budget: RayCount
    step: int = 0
    progress: dict = field(default_factory=dict)
    ema: Any = None  # optim.ParameterEma | None
    #: model parallel: JSON {"model_parallel": K, "partition": ...} (``render.regions.Partition``); None: K = 1
    layout: str | None = None
    #: --grad_sync delayed | periodic (``training.gradsync``): ``settle()`` before a checkpoint (collective),
    #: ``state_dict()`` (the same on every rank), ``restore(state or None)`` (collective); None: every
    exchange: Any = None
    #: called before the random streams are read (the trainer un-draws rays it drew ahead: --draw_ahead)
    before_pack: Callable[[], None] | None = None

    @property
    def n_rays(self) -> int:
        return self.budget.n_rays

    @n_rays.setter
    def n_rays(self, value: int) -> None:
        self.budget.n_rays = int(value)

    # ------------------------------------------------------------------ per-rank random streams

    def _streams(self) -> list[tuple[str, Tensor]]:
        device = self.sampler.device
        out = [("torch_cpu", torch.get_rng_state())]
        if device.type == "cuda":
            out.append(("torch_cuda", torch.cuda.get_rng_state(device)))
        out += [
            ("sampler", self.sampler.generator.get_state()),
            ("background", self.bg_gen.get_state()),
            ("n_rays", torch.tensor([self.n_rays], dtype=torch.int64).view(torch.uint8)),
        ]
        return out

    def stream_layout(self) -> list[list]:
        """``[[name, n_bytes], ...]`` of ``pack_streams``; equal on every rank of a run (same device type)."""
        return [[name, int(t.numel())] for name, t in self._streams()]

    def pack_streams(self) -> Tensor:
        """This rank's random-generator states and ray count as one byte vector ``[L]`` uint8 (CPU)."""
        if self.before_pack is not None:
            self.before_pack()
        if hasattr(self.budget, "settle"):
            self.budget.settle()
        return torch.cat([t.reshape(-1).to("cpu", torch.uint8) for _, t in self._streams()])

    def unpack_streams(self, blob: Tensor, layout: list[list]) -> None:
        """Inverse of ``pack_streams``; ``layout`` must equal this state's ``stream_layout()``."""
        if [list(x) for x in layout] != self.stream_layout():
            raise ValueError(
                f"random-stream layout {json.dumps(layout)} does not match this run's "
                f"{json.dumps(self.stream_layout())}"
            )
        parts = dict(
            zip([name for name, _ in layout], torch.split(blob.to("cpu", torch.uint8), [n for _, n in layout]))
        )
        torch.set_rng_state(parts["torch_cpu"].clone())
        if "torch_cuda" in parts:
            torch.cuda.set_rng_state(parts["torch_cuda"].clone(), self.sampler.device)
        self.sampler.generator.set_state(parts["sampler"].clone())
        self.bg_gen.set_state(parts["background"].clone())
        self.n_rays = int(parts["n_rays"].clone().view(torch.int64)[0])

    def reseed(self, frames: Frames, seed: int, rank: int, size: int, new_sampler: NewSampler | None = None) -> None:
        """New shard and fresh streams for (``rank``, ``size``) at the current step (world changed)."""
        self.sampler, self.bg_gen = make_rank_streams(
            frames, seed, rank, size, self.sampler.device, self.step, new_sampler
        )
