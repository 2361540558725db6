"""One training step: render, loss, backward, gradient exchange, optimizer update.

The step interface: a ``TrainingStep`` is built once from a ``StepContext`` (what every step reads and no
step changes: field, grid, optimizer, marching, loss, precision, scaler, renderer, guard, gradient
accumulation, importance weights in the gradient, the ``--grad_sync`` exchange) and its ``run(StepInputs)``
(rays, background, jitter, step number, loss scale, timer) returns a ``StepResult``. ``EagerStep`` runs
``train_step(ctx, inputs)`` with the reference or the fast renderer, ``ModelParallelStep`` the same with the
segment-exchanging renderer (its samples come from the exchange), ``graphed.GraphedStep`` the same step as two
CUDA graphs. ``Trainer.step`` draws the rays and calls whichever was built. ``masked_mean`` reduces per-ray
losses ``[R, C]`` without a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, ContextManager, Protocol, TypeAlias, cast

import torch
from torch import Tensor

from .. import faultpoints
from ..data.sampler import RayBatch
from ..model.field import NGPField
from ..observe.profiling import NULL_TIMER, StageTimer
from ..render import render_rays
from ..render.occupancy import OccupancyGrid
from ..render.volume import composite_background, over_background
from ..state.failures import NonFiniteGuard
from .gradsync import Exchange
from .model_parallel import ModelParallel
from .recipe import LossFn, Marching

if TYPE_CHECKING:  # the fast renderer needs Triton: imported only when selected
    from ..render.fast import FastRenderer


def masked_mean(values: Tensor, valid: Tensor | None, weight: Tensor | None = None) -> Tensor:
    """Mean of ``[R, C]`` values over the rays where ``valid`` ``[R]`` holds (all when None), each ray's
    values multiplied by its importance ``weight`` ``[R]`` (None: 1); no host sync."""
    if valid is None and weight is None:
        return values.mean()
    count = values.new_tensor(float(values.shape[0])) if valid is None else valid.to(values.dtype).sum()
    w = torch.ones_like(values[:, 0]) if valid is None else valid.to(values.dtype)
    if weight is not None:
        w = w * weight.to(values.dtype)
    return (values * w[:, None]).sum() / (count * values.shape[1]).clamp(min=1.0)


def ray_losses(
    rgb: Tensor,
    opacity: Tensor,
    background: Tensor,
    target: Tensor,
    loss_fn,
    valid: Tensor | None,
    weight: Tensor | None,
    weight_gradient: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The step's loss terms from rendered ``rgb`` ``[R, 3]`` and ``opacity`` ``[R]`` over ``background``
    ``[R, 3]`` against ``target`` ``[R, 3]``: (pred ``[R, 3]``, per-channel loss ``[R, 3]``, the reported loss
    (weighted by ``weight``), the loss to back-propagate (the same tensor unless ``weight_gradient`` is off
    and there are weights)); means over the ``valid`` rays."""
    pred = over_background(rgb, opacity, background)
    per_channel = loss_fn(pred, target)
    loss = masked_mean(per_channel, valid, weight)
    trained = loss if weight_gradient or weight is None else masked_mean(per_channel, valid)
    return pred, per_channel, loss, trained


@dataclass
class StepResult:
    """loss, mse: device scalars; n_samples (through the network), n_candidates (marched): ints on the
    reference path, device scalars on the fast path (read them without blocking: see ``RayBudget``)."""

    loss: Tensor
    mse: Tensor
    n_samples: int | Tensor
    n_candidates: int | Tensor
    n_valid: int | Tensor
    # a non-finite loss or gradients on some rank: no rank took the optimizer step; None: not decided yet
    # (``--defer_verdict``: ``Trainer.settle`` sets it)
    skipped: bool | None = False
    ray_loss: Tensor | None = None
    valid: Tensor | None = None
    # the three counts in one device tensor ``[3]`` float (samples, candidates, valid rays) where the step has
    # them so (the graphed step): ``RayBudget.update`` copies it to the host as it is, with no stack kernel
    counts: Tensor | None = None


AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}

#: what renders a step's rays besides the reference ``render.render_rays`` (None): the fast GPU renderer or the
#: model-parallel segment exchange (both called with ``render_rays``'s arguments)
Renderer: TypeAlias = "FastRenderer | ModelParallel"


@dataclass(frozen=True)
class StepContext:
    """What a training step reads that does not change from step to step, built once (``builder.build_parts``)
    and handed to every step implementation; the objects it names change (parameters, optimizer state), the
    references do not.

    ``loss_fn``: element-wise ``(pred [R, 3], target [R, 3]) -> [R, 3]``; ``precision``: the MLPs' autocast
    (fp32 | fp16 | bf16); ``scaler``: fp16 autocast or fp16 compression; ``renderer``: None for the reference;
    ``guard``: every rank skips a non-finite step; ``backward_passes`` > 1: gradient accumulation;
    ``weight_gradient``: importance weights in the gradient; ``exchange``: ``--grad_sync delayed|periodic``
    (None: Horovod's DistributedOptimizer, or none, averages every step)."""

    field: NGPField
    grid: OccupancyGrid
    optimizer: torch.optim.Optimizer
    march: Marching
    loss_fn: LossFn
    precision: str = "fp32"
    scaler: torch.amp.GradScaler | None = None
    renderer: Renderer | None = None
    guard: NonFiniteGuard | None = None
    backward_passes: int = 1
    weight_gradient: bool = True
    exchange: Exchange | None = None


@dataclass(frozen=True)
class StepInputs:
    """What changes every step: ``rays`` ``[R]``, ``background`` ``[R, 3]`` (or ``[1, 3]`` expanded), marching
    ``jitter`` ``[R]`` (None: none), ``step`` (0-based), the rank's ``loss_scale`` (``data.balance``), the stage
    ``timer``; for a graphed step ``meanwhile`` (host work while the GPU runs, ``--draw_ahead``) and
    ``after_forward`` (settling the previous step's deferred verdict)."""

    rays: RayBatch
    background: Tensor
    jitter: Tensor | None
    step: int = 0
    loss_scale: float = 1.0
    timer: StageTimer = NULL_TIMER
    meanwhile: Callable[[], None] | None = None
    after_forward: Callable[[], None] | None = None


def train_step(ctx: StepContext, inputs: StepInputs) -> StepResult:
    """Render ``inputs.rays``, compare with their pixels on ``inputs.background``, and take one optimizer step.

    ``rays.weight`` (importance weights of non-uniform sampling) always weight the reported loss and
    MSE; they weight the gradient when ``ctx.weight_gradient``. ``inputs.loss_scale`` multiplies the loss
    that is back-propagated (a rank's share of the step's rays, see ``data.balance``).

    ``ctx.backward_passes`` > 1 splits the rays into that many chunks with one backward pass each
    (gradient accumulation, Horovod's ``backward_passes_per_step``); each chunk's loss is weighted
    by its share of the rays, so on the reference path the summed gradient is the whole batch's.
    Every rank calls this every step, even with no samples: the gradient allreduce (started in
    backward, waited for by ``optimizer.synchronize()``) must see every rank. With a gradient scaler (fp16
    autocast or fp16 compression), Horovod's pattern: synchronize (allreduce), unscale, then step without a
    second synchronisation. With a guard, every rank skips the optimizer step when the loss or the reduced
    gradients are non-finite on any rank (messages and test faults name the 1-based step). An ``exchange``
    zeroes the gradients and, after backward, decides how they meet and takes the optimizer step (the
    optimizer is then not Horovod's).
    """
    rays, background, jitter, timer = inputs.rays, inputs.background, inputs.jitter, inputs.timer
    field, march, exchange, step = ctx.field, ctx.march, ctx.exchange, inputs.step + 1
    device_type = rays.origins.device.type
    render = ctx.renderer or render_rays
    target = composite_background(rays.rgba, background)
    n = len(rays)
    bounds = [round(i * n / ctx.backward_passes) for i in range(ctx.backward_passes + 1)]
    loss = mse = torch.zeros((), device=rays.origins.device)
    n_samples: int | Tensor = 0
    n_candidates: int | Tensor = 0
    n_valid: int | Tensor = 0
    ray_loss: list[Tensor] = []
    valids: list[Tensor | None] = []
    ctx.optimizer.zero_grad() if exchange is None else exchange.zero_grad()
    autocast = AUTOCAST.get(ctx.precision, torch.float32)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a == b:
            continue
        part, share = slice(a, b), (b - a) / n
        o, d, jit = rays.origins[part], rays.directions[part], None if jitter is None else jitter[part]
        with torch.autocast(device_type, dtype=autocast, enabled=ctx.precision in AUTOCAST):
            out = render(
                field,
                field.density,
                o,
                d,
                field.aabb,
                ctx.grid,
                march.schedule,
                march.early_termination,
                jit,
                timer=timer,
            )
        valid = getattr(out, "valid", None)
        weight = None if rays.weight is None else rays.weight[part]
        pred, per_channel, reported, backpropagated = ray_losses(
            out.rgb, out.opacity, background[part], target[part], ctx.loss_fn, valid, weight, ctx.weight_gradient
        )
        part_loss = faultpoints.poison_loss(reported, step) * share  # test hook
        trained = part_loss if backpropagated is reported else faultpoints.poison_loss(backpropagated, step) * share
        if inputs.loss_scale != 1.0:
            trained = trained * inputs.loss_scale
        (trained if ctx.scaler is None else ctx.scaler.scale(trained)).backward()
        loss = loss + part_loss.detach()
        mse = mse + masked_mean((pred.detach() - target[part]) ** 2, valid, weight) * share
        n_samples, n_candidates = n_samples + out.n_samples, n_candidates + out.n_candidates
        n_valid = n_valid + ((b - a) if valid is None else valid.sum())
        ray_loss.append(per_channel.detach().float().mean(dim=1))
        valids.append(valid)
    timer.mark("backward")
    if exchange is not None:
        skipped = exchange.finish(ctx.optimizer, ctx.guard, loss, step)
        timer.mark("optimizer")
        return _result(loss, mse, n_samples, n_candidates, n_valid, skipped, ray_loss, valids)
    skipped = optimizer_update(ctx.optimizer, ctx.guard, ctx.scaler, loss, step, timer)
    return _result(loss, mse, n_samples, n_candidates, n_valid, skipped, ray_loss, valids)


class HorovodOptimizer(Protocol):
    """What ``optimizer_update`` uses of Horovod's DistributedOptimizer beyond a torch optimizer's methods."""

    def synchronize(self) -> None: ...

    def skip_synchronize(self) -> ContextManager[None]: ...


def optimizer_update(
    optimizer: torch.optim.Optimizer,
    guard: NonFiniteGuard | None,
    scaler: torch.amp.GradScaler | None,
    loss: Tensor,
    step: int,
    timer: StageTimer,
) -> bool:
    """After backward (``--grad_sync every``): wait for Horovod's gradient allreduce, let the guard decide, step
    (Horovod's pattern with a scaler: synchronize, unscale, step without a second synchronisation). Returns
    whether the step was skipped (identical on every rank)."""
    if guard is not None:
        guard.submit(loss)
    distributed = hasattr(optimizer, "synchronize")  # Horovod DistributedOptimizer
    if distributed:
        horovod = cast(HorovodOptimizer, optimizer)  # what has synchronize is Horovod's, which has both
        horovod.synchronize()  # waits for the gradient allreduce started during backward
        timer.mark("allreduce")
    skipped = guard is not None and guard.should_skip(optimizer, step, check_gradients=scaler is None)
    if not skipped:
        if scaler is not None:
            scaler.unscale_(optimizer)
        if distributed:
            with horovod.skip_synchronize():
                optimizer.step() if scaler is None else scaler.step(optimizer)
        else:
            optimizer.step() if scaler is None else scaler.step(optimizer)
        if scaler is not None:
            scaler.update()
    timer.mark("optimizer")
    return skipped


def _result(
    loss: Tensor,
    mse: Tensor,
    n_samples,
    n_candidates,
    n_valid,
    skipped: bool,
    ray_loss: list[Tensor],
    valids: list[Tensor | None],
) -> StepResult:
    """The step's result from its backward passes' per-ray losses ``[r_i]`` and valid masks (None: all)."""
    all_valid = (
        None
        if all(v is None for v in valids)
        else torch.cat(
            [
                torch.ones(len(r), dtype=torch.bool, device=r.device) if v is None else v
                for r, v in zip(ray_loss, valids)
            ]
        )
    )
    return StepResult(
        loss, mse, n_samples, n_candidates, n_valid, skipped, torch.cat(ray_loss) if ray_loss else None, all_valid
    )


class TrainingStep(Protocol):
    """One training step on every rank (collective): render, loss, backward, gradient exchange, update. Built
    from a ``StepContext``; ``run`` takes what changes per step."""

    def run(self, inputs: StepInputs) -> StepResult: ...

    def budget_result(self, res: StepResult) -> StepResult:
        """What the ray budget learns from ``res`` (``RayBudget.update``)."""
        ...


@dataclass(frozen=True)
class EagerStep:
    """``train_step`` with its context (the reference or the fast renderer)."""

    ctx: StepContext

    def run(self, inputs: StepInputs) -> StepResult:
        return train_step(self.ctx, inputs)

    def budget_result(self, res: StepResult) -> StepResult:
        return res


@dataclass(frozen=True)
class ModelParallelStep(EagerStep):
    """The eager step with the segment-exchanging renderer (``ctx.renderer``: a ``ModelParallel``). The replica's
    K ranks adapt to the same ray count, so they keep drawing the same rays: the budget learns the
    replica's samples from the exchange."""

    def budget_result(self, res: StepResult) -> StepResult:
        mp = self.ctx.renderer
        assert isinstance(mp, ModelParallel), "a model-parallel step renders with the segment exchange"
        return replace(res, n_samples=mp.take_step_samples(), counts=None)
