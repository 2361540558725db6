"""The training step replayed as CUDA graphs (``--cuda_graphs``): the same step as ``step.train_step``
with a few host calls instead of hundreds of kernel launches.

Per step, on the host: rays and random numbers drawn as before (eager), copied into the first ``n``
rows of fixed input buffers of ``rays`` rows; graph A replayed (zero the flat gradients, march,
network, compositing, loss, backward, the non-finite flags); then, outside any graph, the one
Horovod allreduce of the flat gradients is started (``cluster.flatgrad``; none at size 1); the
caller's ``meanwhile`` runs while graph A and that allreduce are in flight (``--draw_ahead``: the
next step's rays); then the step waits for the allreduce and reads the guard's verdict (one host
read of its two flags); then graph B replayed (the optimizer step, Adam with ``capturable=True``
and its learning rate in a device tensor). Rows past ``n`` are parked outside the scene box: they
march no sample and are left out of the loss, so the loss is the eager one.

That read is the step's one wait for the GPU. ``--defer_verdict`` (default ``auto``: wherever torch's fused
Adam and the guard allow) removes it:
graph B itself skips a step whose reduced loss flag is set (the fused kernel's ``found_inf``), the
flags are copied to the host without blocking, and ``GraphedStep.settle`` hands them to the guard
during the next step (after its graph A is launched) or when the trainer asks (evaluation,
checkpoints, log intervals). The guard's counts, messages and limit are those of the waiting step,
one step later; a stop signal carried by the flags is acted on one step later, on every rank alike.

A capture is specialised to a ``CaptureKey``: the input rows, the fast renderer's two buffer sizes,
and whether the rays carry importance weights. The ray budget changes the ray count every step,
so the rows are planned with headroom (``ray_capacity``) and a new capture happens only when the
count outgrows them or the budget's buffer sizes change (once per log interval at most). The
first ``EAGER_STEPS`` steps run the same code without capture (Adam's state, the kernels'
compilation and the ray count settle first).

Not graphed (``eligibility`` says why): the CPU, the reference path, the tcnn backend, fp16 autocast
or fp16 compression across ranks (their gradient scaler reads the device every step), gradient
accumulation, elastic jobs, tiny-cuda-nn's sparse Adam rule, armed test faults, ``--grad_sync`` other than
``every`` (``training.gradsync``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..cluster import dist
from ..cluster.flatgrad import FlatGradients
from ..data.sampler import RayBatch
from ..errors import ConfigError
from ..faultpoints import ENV as FAULTS_ENV
from ..render.occupancy import OccupancyGrid
from ..render.volume import composite_background
from ..state.failures import NonFiniteGuard
from .budget import copy_to_host
from .grid_sync import max_over_ranks, rank_share
from .model_parallel import ModelParallel
from .step import AUTOCAST, StepContext, StepInputs, StepResult, masked_mean, ray_losses

#: steps run eagerly (same code, no capture) before the first capture
EAGER_STEPS = 16
#: input rows are planned in multiples of this many rays, with this much headroom over the count
RAY_QUANTUM = 4096
RAY_HEADROOM = 1.25


@dataclass(frozen=True)
class CaptureKey:
    """What a capture is specialised to: input rows, marched-sample and network-sample buffer sizes,
    importance weights present."""

    rays: int
    candidate_capacity: int
    sample_capacity: int
    weighted: bool


def ray_capacity(n_rays: int, current: int | None, max_rays: int, quantum: int = RAY_QUANTUM) -> int:
    """Input rows for ``n_rays`` rays: ``current`` while they fit, else ``n_rays`` x ``RAY_HEADROOM``
    rounded up to ``quantum`` (no more than ``max_rays`` rounded up; never below ``n_rays``)."""
    if n_rays < 1:
        raise ValueError(f"a step needs at least one ray, got {n_rays}")
    if current is not None and n_rays <= current:
        return current
    ceiling = math.ceil(max(max_rays, n_rays) / quantum) * quantum
    return max(min(math.ceil(n_rays * RAY_HEADROOM / quantum) * quantum, ceiling), n_rays)


def eligibility(
    device: torch.device,
    fast_renderer: bool,
    precision: str,
    backward_passes: int,
    elastic: bool,
    sparse_hash_updates: bool,
    scaled: bool = False,
    backend: str = "triton",
    grad_sync: str = "every",
) -> str | None:
    """None when the step can be graphed, else the reason it cannot (for the log and ``--cuda_graphs on``)."""
    reasons = [
        (device.type != "cuda", "the device is not a CUDA GPU"),
        (
            not fast_renderer,
            "the step has no fixed-size renderer (the reference path: use --backend triton; or --model_parallel > 1)",
        ),
        (
            backend == "tcnn",
            "the tcnn backend (tiny-cuda-nn records events on its own streams, which a capture "
            "refuses: 'operation failed due to a previous error during capture' on an H200)",
        ),
        (
            precision == "fp16",
            "--precision fp16 needs a gradient scaler, which reads the device every step (use bf16 or fp32)",
        ),
        (backward_passes > 1, "gradient accumulation (backward_passes_per_step > 1)"),
        (elastic, "an elastic job (its world, and with it the optimizer, can change)"),
        (sparse_hash_updates, "sparse hash-table updates (optimizer.sparse_hash_updates)"),
        (
            scaled and precision != "fp16",
            "a gradient scaler (--compression fp16 across ranks) reads the device every step",
        ),
        (FAULTS_ENV in os.environ, f"test faults are armed ({FAULTS_ENV})"),
        (grad_sync != "every", f"--grad_sync {grad_sync} (the graphed step averages every step only)"),
    ]
    found = [why for bad, why in reasons if bad]
    return "; ".join(found) if found else None


def use_graphs(mode: str, reason: str | None, device: torch.device) -> bool:
    """``--cuda_graphs`` ``mode`` with ``eligibility``'s ``reason`` -> graph the step? ``on`` where it cannot be
    is a ``ConfigError``; ``auto`` on a GPU says in the log why not."""
    if mode == "on" and reason:
        raise ConfigError(f"--cuda_graphs on: the training step cannot be graphed here: {reason}")
    if mode == "auto" and reason and device.type == "cuda":
        dist.log(f"CUDA graphs: off ({reason})")
    return mode != "off" and reason is None


def set_learning_rate(group: dict, value: float) -> None:
    """Set a parameter group's learning rate; a device tensor (graphed Adam) is filled in place, and only
    when the value changes (one small kernel)."""
    lr = group["lr"]
    if isinstance(lr, Tensor):
        if group.get("_lr_value") != value:
            lr.fill_(value)
            group["_lr_value"] = value
    else:
        group["lr"] = value


def portable_state(optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """``optimizer.state_dict()`` as a plain (non-capturable) Adam writes it: learning rates as floats,
    step counts on the host, so checkpoints of graphed and eager runs load into either."""
    groups = []
    for group in state["param_groups"]:
        group = {k: v for k, v in group.items() if k != "_lr_value"}
        if isinstance(group["lr"], Tensor):
            live = next((g for g in optimizer.param_groups if g["lr"] is group["lr"]), {})
            group["lr"] = float(live.get("_lr_value", group["lr"]))
        group["capturable"] = False
        groups.append(group)
    entries = {}
    for key, entry in state["state"].items():
        entry = dict(entry)  # the live state's dict: copied, not changed
        if isinstance(entry.get("step"), Tensor) and entry["step"].is_cuda:
            entry["step"] = entry["step"].detach().to("cpu", torch.float32)
        entries[key] = entry
    return {"state": entries, "param_groups": groups}


def warm_up(body: Callable[[], object], device: torch.device) -> None:
    """Run ``body`` once on a side stream before it is captured (allocations made, kernels compiled; its
    results are discarded), ordered after and before the current stream's work."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream(device).wait_stream(side)


class GraphedStep:
    """``step.train_step`` as two CUDA graphs per ``CaptureKey`` (see the module docstring); the step interface
    (``step.TrainingStep``).

    ``ctx``: the step's context, with Adam built with ``capturable=True`` and not wrapped by Horovod, the fast
    renderer (its capacities are read at every call), no gradient scaler, accumulation or exchange
    (``eligibility``). ``grads``: the flat gradient buffers of the field's parameters, with a tail of
    ``guard.width`` floats when the context has a guard.
    """

    def __init__(
        self,
        ctx: StepContext,
        grads: FlatGradients,
        compression: str = "none",
        max_rays: int = 1 << 20,
        eager_steps: int = EAGER_STEPS,
        defer_verdict: bool = False,
    ) -> None:
        renderer, guard, optimizer = ctx.renderer, ctx.guard, ctx.optimizer
        if renderer is None or isinstance(renderer, ModelParallel):
            raise ValueError("a graphed step renders with the fast renderer (its buffers have fixed sizes)")
        unfit = [
            what
            for bad, what in (
                (ctx.scaler is not None, "a gradient scaler"),
                (ctx.backward_passes != 1, f"{ctx.backward_passes} backward passes"),
                (ctx.exchange is not None, "a --grad_sync exchange"),
            )
            if bad
        ]
        if unfit:  # eligibility() keeps the trainer from asking
            raise ValueError(f"a graphed step cannot take {' or '.join(unfit)}")
        if guard is not None and (grads.tail is None or grads.tail.numel() != guard.width):
            raise ValueError("the flat gradients need a tail of guard.width floats for the guard's flags")
        why_not = defer_verdict and why_not_deferred(optimizer, guard)
        if why_not:
            raise ValueError(f"the guard's verdict cannot be deferred: {why_not}")
        self.ctx, self.renderer, self.grads, self.compression = ctx, renderer, grads, compression
        self.max_rays, self.eager_steps, self.ray_quantum = max_rays, eager_steps, RAY_QUANTUM
        self.device = ctx.field.aabb.device
        for group in optimizer.param_groups:  # capturable Adam reads its learning rate from the device
            if not isinstance(group["lr"], Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), device=self.device)
        self.key: CaptureKey | None = None
        self.captures = 0  # how many times the step was captured (a new key each time)
        self.graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None
        self.inputs: dict[str, Tensor] = {}
        self.outputs: tuple[Tensor, Tensor, Tensor] | None = None
        self._loss_scale: float | None = None
        # --defer_verdict: graph B skips a non-finite step itself (fused Adam leaves the parameters, moments
        # and step counts as they were where found_inf is 1); the host reads the verdict in ``settle``
        self.defer_verdict = defer_verdict
        self._pending: tuple[int, Tensor, torch.cuda.Event | None] | None = None
        if defer_verdict:
            self._found = torch.zeros((), device=self.device)
            # read by every fused Adam step, the captured one included (how torch's GradScaler hands it over)
            optimizer.found_inf = self._found  # type: ignore[attr-defined]  # torch reads it with getattr
        self.lr = [group["lr"] for group in optimizer.param_groups]
        optimizer.register_state_dict_post_hook(portable_state)
        optimizer.register_load_state_dict_post_hook(self._after_load)

    @staticmethod
    def build(ctx: StepContext, compression: str, max_rays: int, defer_verdict: str = "auto") -> "GraphedStep":
        """The trainer's graphed step: flat gradients (a tail for the guard's flags) and the step, logged.
        ``compression``: of the flat gradients' allreduce; ``max_rays``: the ray budget's ceiling (input rows);
        ``defer_verdict`` (``--defer_verdict``): ``auto`` and ``on`` defer it where ``why_not_deferred``
        allows; ``on`` also says in the log why not."""
        guard = ctx.guard
        grads = FlatGradients(ctx.field.named_parameters(), tail=guard.width if guard else 0)
        wanted = defer_verdict in ("auto", "on")
        why_not = why_not_deferred(ctx.optimizer, guard) if wanted else None
        if why_not and defer_verdict == "on":
            dist.log(f"deferred verdict: off ({why_not})")
        step = GraphedStep(ctx, grads, compression, max_rays, defer_verdict=wanted and why_not is None)
        verdict = "; the non-finite verdict read one step later" if step.defer_verdict else ""
        dist.log(
            f"CUDA graphs: on (the step is captured after {step.eager_steps} eager steps; gradients in flat "
            f"buffers, {grads.describe()}{verdict})"
        )
        return step

    def _after_load(self, optimizer: torch.optim.Optimizer) -> None:
        """A loaded state (a resume, a broadcast): back to capturable form; the new state tensors need a
        new capture."""
        for group, lr in zip(optimizer.param_groups, self.lr):
            value = float(group["lr"])
            group["lr"], group["capturable"] = lr, True
            lr.fill_(value)
            group["_lr_value"] = value
            for p in group["params"]:
                st = optimizer.state.get(p, {})
                if isinstance(st.get("step"), Tensor) and st["step"].device != p.device:
                    st["step"] = st["step"].to(device=p.device, dtype=torch.float32)
        self.graphs = None
        self.key = None

    # ----------------------------------------------------------------------------------- inputs

    def _allocate(self, rows: int, weighted: bool) -> None:
        """Input buffers of ``rows`` rows (zeros: finite where parked)."""
        dev = self.device
        self.inputs = {
            "origins": torch.zeros(rows, 3, device=dev),
            "directions": torch.ones(rows, 3, device=dev),
            "rgba": torch.zeros(rows, 4, device=dev),
            "background": torch.zeros(rows, 3, device=dev),
            "jitter": torch.zeros(rows, device=dev),
            "n": torch.zeros((), dtype=torch.int64, device=dev),
            "loss_scale": torch.ones((), device=dev),
            "rows": torch.arange(rows, device=dev),
        }
        if weighted:
            self.inputs["weight"] = torch.ones(rows, device=dev)
        lo, hi = self.ctx.field.aabb[0], self.ctx.field.aabb[1]
        # parked rows start beyond the box's far corner and look away from it: no sample, no gradient
        self.inputs["parked_origin"] = hi + (hi - lo)
        self.inputs["parked_direction"] = torch.full((3,), 3**-0.5, device=dev)
        self._loss_scale = None

    def _load(self, rays: RayBatch, background: Tensor, jitter: Tensor, loss_scale: float) -> None:
        n, inp = len(rays), self.inputs
        inp["origins"][:n].copy_(rays.origins)
        inp["directions"][:n].copy_(rays.directions)
        inp["rgba"][:n].copy_(rays.rgba)
        inp["background"][:n].copy_(background)
        inp["jitter"][:n].copy_(jitter)
        if rays.weight is not None:
            inp["weight"][:n].copy_(rays.weight)
        inp["n"].fill_(n)
        if loss_scale != self._loss_scale:
            inp["loss_scale"].fill_(loss_scale)
            self._loss_scale = loss_scale

    # ----------------------------------------------------------------------------------- the step body

    def _forward_backward(self) -> tuple[Tensor, Tensor, Tensor]:
        """Graph A's body: -> (stats ``[5]`` = loss, mse, samples, candidates, valid rays; ray loss ``[rows]``;
        valid ``[rows]``). No host synchronisation and no collective."""
        inp, ctx, tail = self.inputs, self.ctx, self.grads.tail
        field, march = ctx.field, ctx.march
        self.grads.zero_()
        active = inp["rows"] < inp["n"]
        origins = torch.where(active[:, None], inp["origins"], inp["parked_origin"])
        directions = torch.where(active[:, None], inp["directions"], inp["parked_direction"])
        background = inp["background"]
        target = composite_background(inp["rgba"], background)
        weight = inp.get("weight")
        autocast = ctx.precision in AUTOCAST
        with torch.autocast(
            "cuda", dtype=AUTOCAST.get(ctx.precision, torch.float32), enabled=autocast, cache_enabled=False
        ):  # a cast cache would outlive the capture
            out = self.renderer(
                field,
                field.density,
                origins,
                directions,
                field.aabb,
                ctx.grid,
                march.schedule,
                march.early_termination,
                inp["jitter"],
            )
        valid = out.valid & active
        pred, per_channel, loss, trained = ray_losses(
            out.rgb, out.opacity, background, target, ctx.loss_fn, valid, weight, ctx.weight_gradient
        )
        (trained * inp["loss_scale"]).backward()
        mse = masked_mean((pred.detach() - target) ** 2, valid, weight)
        if ctx.guard is not None:  # loss or local gradients not finite (reduced with the gradients)
            assert tail is not None, "a guard's flags ride in the tail (__init__)"
            total = torch.stack([b.float().sum() for b in self.grads.buffers.values()]).sum()
            tail[0] = (~(torch.isfinite(loss.detach()) & torch.isfinite(total))).float()
        stats = torch.stack(
            [loss.detach().float(), mse.float(), out.n_samples.float(), out.n_candidates.float(), valid.sum().float()]
        )
        return stats, per_channel.detach().float().mean(dim=1), valid

    def _update(self) -> None:
        """Graph B's body: the optimizer step (with a deferred verdict, skipped on the device where the reduced
        loss flag is set)."""
        if self.defer_verdict:
            assert self.grads.tail is not None, "a deferred verdict needs a guard, whose flags ride in the tail"
            self._found.copy_(self.grads.tail[0] > 0)
        self.ctx.optimizer.step()

    def _capture(self, key: CaptureKey) -> None:
        """Capture graphs A (forward and backward) and B (optimizer step) for ``key``; the inputs hold this
        step's rays. A warm-up pass on a side stream first (its gradients are discarded)."""
        self.graphs = self.outputs = None
        warm_up(self._forward_backward, self.device)
        pool = torch.cuda.graph_pool_handle()
        forward_backward, update = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        # thread_local: the sampler's prefetch thread (images in host memory) may copy to the GPU meanwhile
        with torch.cuda.graph(forward_backward, pool=pool, capture_error_mode="thread_local"):
            outputs = self._forward_backward()
        with torch.cuda.graph(update, pool=pool, capture_error_mode="thread_local"):
            self._update()
        self.graphs, self.outputs, self.key = (forward_backward, update), outputs, key
        self.captures += 1

    # ----------------------------------------------------------------------------------- one step

    def _launch(self, inputs: StepInputs) -> tuple[Tensor, Tensor, Tensor, torch.cuda.CUDAGraph | None]:
        """``inputs`` copied into the input buffers (new ones, and a new capture, where the key changed), then
        graph A replayed (captured first where needed) or, in the first ``eager_steps`` steps, its body run:
        -> (stats ``[5]``, ray loss ``[rows]``, valid ``[rows]``, graph B or None: run ``_update`` eagerly)."""
        rays, jitter = inputs.rays, inputs.jitter
        if jitter is None:
            raise ValueError("a graphed step marches with jitter: StepInputs.jitter is None")
        n = len(rays)
        current = self.inputs["origins"].shape[0] if self.inputs else None
        rows = ray_capacity(n, current, self.max_rays, self.ray_quantum)
        key = CaptureKey(rows, self.renderer.candidate_capacity, self.renderer.sample_capacity, rays.weight is not None)
        if not self.inputs or self.inputs["origins"].shape[0] != rows or ("weight" in self.inputs) != key.weighted:
            self.graphs = None
            self._allocate(rows, key.weighted)
        self._load(rays, inputs.background.expand(n, 3), jitter, inputs.loss_scale)
        inputs.timer.mark("sampling")
        if inputs.step < self.eager_steps:
            stats, ray_loss, valid = self._forward_backward()
            inputs.timer.mark("backward")
            return stats, ray_loss, valid, None
        if self.graphs is None or key != self.key:
            self._capture(key)
        assert self.graphs is not None and self.outputs is not None, "_capture sets both"
        self.graphs[0].replay()
        inputs.timer.mark("graph: forward and backward")
        return (*self.outputs, self.graphs[1])

    def run(self, inputs: StepInputs) -> StepResult:
        """One training step (``inputs.step``: 0-based) on ``inputs.rays`` (background ``[R, 3]``, jitter ``[R]``).

        ``inputs.meanwhile``: host work to do while the GPU runs graph A and the gradient allreduce is in flight,
        before the step waits for them (the trainer draws the next step's rays: ``--draw_ahead``); it must
        not touch the parameters or their gradients. ``inputs.after_forward``: host work right after graph A is
        launched, before the allreduce (the trainer settles the step before, ``settle``). With a deferred
        verdict the result's ``skipped`` is None: ``settle`` decides it, at the next step or when asked."""
        n, step, timer, guard, tail = len(inputs.rays), inputs.step, inputs.timer, self.ctx.guard, self.grads.tail
        stats, ray_loss, valid, update = self._launch(inputs)
        if inputs.after_forward is not None:
            inputs.after_forward()
        if guard is not None and guard.carries_stop:
            assert tail is not None, "a guard's flags ride in the tail (__init__)"
            # before the allreduce: the stop flag travels with it (graph A zeroed the tail: a kernel only for a stop)
            guard.fold_stop(tail, zeroed=True)
        pending = self.grads.allreduce_start(compression=self.compression)  # no call at size 1
        if inputs.meanwhile is not None:
            inputs.meanwhile()
            timer.mark("sampling ahead")
        pending.wait()
        timer.mark("allreduce")
        skipped: bool | None = False
        if guard is not None and not self.defer_verdict:
            assert tail is not None, "a guard's flags ride in the tail (__init__)"
            guard.adopt(tail)
            skipped = guard.should_skip(self.ctx.optimizer, step + 1, check_gradients=False)
        if not skipped:  # a deferred verdict: no host read, graph B skips a non-finite step on the device
            self._update() if update is None else update.replay()
        if self.defer_verdict:  # the flags go to the host meanwhile; settle() hands them to the guard
            assert tail is not None, "a deferred verdict needs a guard, whose flags ride in the tail"
            flags, event = copy_to_host(tail)
            self._pending, skipped = (step + 1, flags, event), None
        timer.mark("optimizer")
        stats = stats.clone()  # the next replay overwrites the graph's outputs
        return StepResult(
            stats[0],
            stats[1],
            stats[2],
            stats[3],
            stats[4],
            skipped,
            ray_loss[:n].clone(),
            valid[:n].clone(),
            counts=stats[2:5],
        )

    def budget_result(self, res: StepResult) -> StepResult:
        return res

    def settle(self) -> bool | None:
        """The deferred verdict on the last step (``guard.decide``: it may raise ``NonFiniteError``), waiting
        for its flags if they have not landed; None when no step waits for one."""
        if self._pending is None:
            return None
        step, flags, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        assert self.ctx.guard is not None, "a deferred verdict needs a guard (why_not_deferred)"
        return self.ctx.guard.decide(flags.tolist(), step)


class GraphedGridUpdate:
    """``OccupancyGrid.update`` after warm-up (``--graph_grid_update``) with most of its launches replayed as one
    CUDA graph: about a hundred small kernels every ``update_interval`` steps become a handful.

    Per update, on the host: the update's random numbers drawn eagerly into fixed buffers
    (``OccupancyGrid.random_draws``: three kernels, seeded by (seed, step) as the eager update's); one replay
    (the occupied-cell pick, this rank's share of the density evaluations, their scatter into the fresh
    values ``[K * R^3]``); then ``OccupancyGrid.merge`` eagerly (the Max allreduce across ranks, which no
    graph may hold, then decay and threshold: a few kernels). The same grid as the eager update. Warm-up
    updates (every cell) and model-parallel regions stay eager. ``capture=False`` runs the same body
    without a graph (the CPU's parity test).
    """

    def __init__(
        self, grid: OccupancyGrid, density_fn, step_size: float, seed: int, chunk: int = 1 << 18, capture: bool = True
    ) -> None:
        self.grid, self.density_fn, self.step_size, self.seed, self.chunk = grid, density_fn, step_size, seed, chunk
        self.capture = capture
        self.draws = grid.random_draws(0, seed)  # fixed buffers, refilled at every update
        self.graph: torch.cuda.CUDAGraph | None = None
        self.fresh: Tensor | None = None
        self.captures = 0

    @torch.no_grad()
    def _body(self) -> Tensor:
        uniform, u, offset = self.draws
        return self.grid.evaluate(
            self.grid.pick(uniform, u), offset, self.density_fn, self.step_size, self.chunk, share=rank_share()
        )

    @torch.no_grad()
    def _capture(self) -> None:
        warm_up(self._body, self.grid.density.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.fresh = self._body()
        self.graph = graph
        self.captures += 1

    @torch.no_grad()
    def __call__(self, step: int) -> None:
        """The update of step ``step`` (collective, as ``OccupancyGrid.update``; after warm-up only)."""
        self.grid.random_draws(step, self.seed, out=self.draws)
        if not self.capture:
            self.grid.merge(self._body(), max_over_ranks)
            return
        if self.graph is None:
            self._capture()
        assert self.graph is not None and self.fresh is not None, "_capture sets both"
        self.graph.replay()
        self.grid.merge(self.fresh, max_over_ranks)


def why_not_deferred(optimizer: torch.optim.Optimizer, guard: NonFiniteGuard | None) -> str | None:
    """None when the graphed step can leave the skip to the device (``--defer_verdict``), else why not."""
    if guard is None:
        return "there is no non-finite guard (--nonfinite_limit 0): nothing to wait for"
    if not optimizer.defaults.get("fused"):
        return 'the optimizer is not torch\'s fused Adam (Adam block "fused"), which alone skips on the device'
    if any(group.get("sparse") for group in optimizer.param_groups):
        return "sparse hash-table updates run outside the fused Adam"
    return None


__all__ = [
    "CaptureKey",
    "EAGER_STEPS",
    "GraphedGridUpdate",
    "GraphedStep",
    "eligibility",
    "portable_state",
    "ray_capacity",
    "set_learning_rate",
    "use_graphs",
    "why_not_deferred",
]
