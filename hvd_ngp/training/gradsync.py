"""When the ranks' gradients meet: ``--grad_sync delayed`` and ``--grad_sync periodic`` (docs/sync-modes.md).

``every`` (the default) is Horovod's DistributedOptimizer: the step waits for the allreduce of its own
gradients. The two modes here take that wait off the step:

- ``DelayedAveraging`` (one-step-delayed averaging): step t's local gradient is copied out of the flat
  gradient buffer (``cluster.flatgrad``) and its allreduce started; the step then waits for step t-1's
  allreduce, which ran during step t's forward and backward, and the optimizer applies that average.
  Every update is an average of all ranks' gradients, one step late; the ranks stay identical. The
  average still in flight is part of the training state: a checkpoint waits for it and saves it, a
  resume applies it at the next step, so a resumed run continues bit for bit. The non-finite guard's
  flags ride in the buffer's tail and are decided with the gradient they travel with (one step late).
- ``PeriodicAveraging`` (local SGD): each rank steps its own optimizer on its own gradient; after every
  H-th step (``--sync_period``; counted in global steps, so the phase survives a resume) one fused
  allreduce averages the parameters, Adam's two moments (``exp_avg``, ``exp_avg_sq``, and the sparse
  rule's ``entry_steps``) and the parameter average (``Ema``, linear in the parameters), so after a sync
  every rank holds the same state. Adam's step count is the same on every rank (the guard skips on all
  ranks together). A checkpoint is a sync point (one extra sync where the step is not a multiple of H),
  so a resumed run continues exactly as one that wrote the same checkpoints; the end of training syncs;
  evaluations read the rank average without changing any rank's state (``consensus``).

Both keep one tiny allreduce per step for the non-finite guard and the stop vote (periodic: the loss flag,
with "my gradients are not finite" folded in, so every rank skips the same steps).

``--grad_sync delayed_grid --compression fp16`` (``wire="fp16"``): the late gradient travels as float16. Each
rank's max |late gradient| rides in the fresh buffer's tail (one more float), so after the fresh allreduce
every rank reads the same bound m (the mean of the ranks' maxima: the sum over ranks of |g_r| / N <= m) and
picks the same power-of-two scale s (``fp16_scale``: m * s < 2^15); the wire carries fp16(g_r * s / N),
summed by the allreduce (at most 2^15 in magnitude: no overflow), and is decoded into the float32 wire
slot as sum / s when it is waited for, so landing, checkpoints and the non-finite checks read float32.

``--delay_compensation local`` (``SpeculativeGrid``, delayed_grid only): the late (grid) parameters the optimizer
steps are the *anchor* theta, the same on every rank, moved only by averages as delayed_grid moves them. Each
rank's forward and backward of step t+1 run on w = theta + the Adam step its own step-t gradient would make
(``optim.Adam.preview``: the committed moments, not changed; the next step's bias corrections and learning
rate). When step t's average lands, theta takes the real step and w is made again from step t+1's gradient. A
checkpoint is a sync point: every rank makes w from the pending average instead (so a resume, which does the
same, continues exactly); evaluations, checkpoints and the parameter average read theta.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, cast

import torch
from torch import Tensor

from ..cluster import dist
from ..cluster.comm import CommSettings
from ..cluster.flatgrad import FlatGradients
from ..model.field import NGPField
from ..state.failures import NonFiniteGuard
from .optim import Adam


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


#: ``fp16_scale``: m * s < 2^FP16_HEADROOM_LOG2 (float16's largest finite value is 65504, about 2^16)
FP16_HEADROOM_LOG2 = 15
#: ``fp16_scale``: s stays within 2^-FP16_SCALE_LIMIT_LOG2 .. 2^FP16_SCALE_LIMIT_LOG2 (float32's range)
FP16_SCALE_LIMIT_LOG2 = 100


def fp16_scale(bound: Tensor) -> Tensor:
    """The power-of-two scale for the fp16 wire from ``bound`` (0-d float32: the mean over ranks of each
    rank's max |gradient|, the same on every rank) -> 0-d float32 s with bound * s < 2^15, on the device
    (no host sync). A bound of 0 (an all-zero gradient) or a non-finite one (the step is not applied) gives
    s = 1; s is clamped to 2^-100 .. 2^100, so it is never 0 or inf."""
    bound = bound.float()
    _, exponent = torch.frexp(bound)  # bound = mantissa * 2^exponent, mantissa in [0.5, 1): bound < 2^exponent
    log2 = (FP16_HEADROOM_LOG2 - exponent).clamp(-FP16_SCALE_LIMIT_LOG2, FP16_SCALE_LIMIT_LOG2)
    usable = torch.isfinite(bound) & (bound > 0)
    log2 = torch.where(usable, log2, torch.zeros_like(log2))
    # 2^log2 from its float32 bits (exponent field log2 + 127, a normal number): exact on every device
    return ((log2.to(torch.int32) + 127) << 23).view(torch.float32)


def _step_without(flat: FlatGradients, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step that leaves ``flat``'s parameters out (their ``p.grad`` None for it, then the views
    back): the optimizer skips a parameter without a gradient."""
    for _, p in flat.params:
        p.grad = None
    optimizer.step()
    flat.attach()


class SpeculativeGrid:
    """``--delay_compensation local``: the anchor theta of the late parameters and each rank's speculative w.

    ``params``: the late ``(name, Parameter)``s, which hold w (what the forward uses) while ``ahead``, else theta;
    ``anchor``: theta while ``ahead`` (one more copy of the grid), else scratch. ``optimizer``: ``optim.Adam``
    (its ``preview`` is the speculative step)."""

    def __init__(self, params: list[tuple[str, torch.nn.Parameter]], optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(optimizer, Adam):
            raise ValueError("--delay_compensation local needs the project's Adam (training.optim.Adam)")
        self.names = [n for n, _ in params]
        self.params: list[Tensor] = [p for _, p in params]
        self.optimizer: Adam = optimizer
        self.anchor = [torch.zeros_like(p, requires_grad=False) for p in self.params]
        self.ahead = False
        self._lrs: list[float] = []  # the learning rate each w was made with

    def _lr(self, p: Tensor) -> float:
        return float(self.optimizer.group_of(p)["lr"])

    @torch.no_grad()
    def rewind(self) -> None:
        """The parameters back to theta (w is spent); the anchor becomes scratch."""
        if self.ahead:
            torch._foreach_copy_(self.params, self.anchor)
            self.ahead = False

    @torch.no_grad()
    def stash(self) -> None:
        """After ``rewind``: keep this rank's late gradient (every ``p.grad``) in the anchor's scratch."""
        assert not self.ahead, "the anchor holds theta while ahead"
        torch._foreach_copy_(self.anchor, self.grads())

    def grads(self) -> list[Tensor]:
        """Every late ``p.grad`` (views into the flat gradient buffers)."""
        grads = [p.grad for p in self.params]
        assert all(g is not None for g in grads), "the late parameters' gradients are flat-buffer views"
        return cast(list[Tensor], grads)

    @torch.no_grad()
    def speculate(self, grads: list[Tensor]) -> None:
        """The parameters hold theta: keep it in the anchor and put w = theta + Adam's step for ``grads`` (may be
        the anchor's scratch, from ``stash``) in the parameters; no step where a gradient is not finite."""
        assert not self.ahead, "speculate from theta"
        for p, a, g in zip(self.params, self.anchor, grads):
            w = self.optimizer.preview(p, g)
            finite = torch.isfinite(g).all()  # on the device: no host sync
            a.copy_(p)
            p.copy_(torch.where(finite, w, a))
        self._lrs = [self._lr(p) for p in self.params]
        self.ahead = True

    @torch.no_grad()
    def follow_learning_rate(self) -> None:
        """Before a step's forward: w's step rescaled to the learning rate the step set (it is linear in it), so
        the speculative step uses the learning rate of the step that will apply the average."""
        if not self.ahead:
            return
        for i, (p, a) in enumerate(zip(self.params, self.anchor)):
            lr, made = self._lr(p), self._lrs[i]
            if lr != made and made != 0.0:
                p.sub_(a).mul_(lr / made).add_(a)
                self._lrs[i] = lr

    def anchored(self, tensors: list[Tensor]) -> list[Tensor]:
        """``tensors`` with each late parameter replaced by its theta (what the parameter average reads)."""
        if not self.ahead:
            return tensors
        theta = {id(p): a for p, a in zip(self.params, self.anchor)}
        return [theta.get(id(t), t) for t in tensors]

    def state(self) -> dict[str, Tensor]:
        """theta by parameter name (what a checkpoint saves in place of w); empty when the parameters hold it."""
        return dict(zip(self.names, self.anchor)) if self.ahead else {}

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """Inside: theta in the parameters; after: w again (a temporary copy of w meanwhile)."""
        if not self.ahead:
            yield
            return
        with torch.no_grad():
            saved = [p.detach().clone() for p in self.params]
            torch._foreach_copy_(self.params, self.anchor)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, saved)


class DelayedAveraging:
    """One-step-delayed gradient averaging over the flat gradient buffers of ``parameters``.

    ``grads``: the flat buffers (every ``p.grad`` a view; the guard's flags in the float32 tail);
    ``wire``: two copies of them, used in turn for the allreduce in flight. ``pending``: the global step
    (1-based) whose average is in flight or landed and not yet applied, None when none is.
    """

    mode = "delayed"

    def __init__(
        self, parameters, guard: NonFiniteGuard | None, fresh=(), wire: str = "fp32", speculate_with=None
    ) -> None:
        """``fresh``: parameters averaged at once, every step (``--grad_sync delayed_grid``: the MLPs), with the
        guard's flags; the rest (the hash grid) one step late. Empty: everything one step late. ``wire``:
        fp32, or fp16 (with ``fresh`` only: the late average travels as scaled float16, module docstring).
        ``speculate_with``: the optimizer (``optim.Adam``) for ``--delay_compensation local`` (``fresh`` only)."""
        if wire not in ("fp32", "fp16"):
            raise ValueError(f"wire must be fp32 or fp16, got {wire!r}")
        fresh_ids = {id(p) for p in fresh}
        named = [item if isinstance(item, tuple) else (f"parameter {i}", item) for i, item in enumerate(parameters)]
        late = [(n, p) for n, p in named if id(p) not in fresh_ids]
        now = [(n, p) for n, p in named if id(p) in fresh_ids and p.requires_grad]
        if wire == "fp16" and not now:
            raise ValueError("the fp16 wire needs fresh parameters: its scale rides in their allreduce")
        self._flags = guard.width if guard else 0
        extra = 1 if wire == "fp16" else 0  # the fp16 wire: this rank's max |late gradient| after the flags
        self.now = FlatGradients(now, tail=self._flags + extra, name="delayed.now") if now else None
        self.grads = FlatGradients(late, tail=0 if self.now is not None else self._flags, name="delayed")
        self.wire = [{dt: torch.zeros_like(b) for dt, b in self.grads.buffers.items()} for _ in range(2)]
        # the fp16 wire: the float16 buffers on the wire and the scale of each slot (0-d, on the device)
        self.half = (
            [
                {dt: torch.zeros(b.numel(), dtype=torch.float16, device=b.device) for dt, b in w.items()}
                for w in self.wire
            ]
            if wire == "fp16"
            else None
        )
        self._scales: list[Tensor | None] = [None, None]
        self.pending: int | None = None
        self._handle: dist.PendingAllreduce | None = None
        self._slot = 0  # the wire buffers of the pending average
        self._late_ok = True  # (fresh mode) the step whose average is in flight was not skipped
        if speculate_with is not None and self.now is None:
            raise ValueError("delay compensation needs fresh parameters (--grad_sync delayed_grid)")
        self.speculative = SpeculativeGrid(self.grads.params, speculate_with) if speculate_with is not None else None

    def zero_grad(self) -> None:
        """Before a step's forward (its learning rate set): zero the gradients; a speculative w follows the rate."""
        if self.speculative is not None:
            self.speculative.follow_learning_rate()
        self.grads.zero_()
        if self.now is not None:
            self.now.zero_()

    def _wait(self) -> None:
        """Wait for the allreduce in flight; the fp16 wire decodes it into the float32 slot (sum / s)."""
        if self._handle is not None:
            self._handle.wait()
            self._handle = None
            if self.half is not None:
                scale = self._scales[self._slot]
                assert scale is not None, "the fp16 wire's scale is set when its allreduce starts"
                for dt, h in self.half[self._slot].items():
                    self.wire[self._slot][dt].copy_(h).div_(scale)

    def finish(self, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard | None, loss: Tensor, step: int) -> bool:
        """After step ``step``'s backward (1-based, collective): send its gradient, apply the previous step's
        average. Returns whether that update was skipped (a non-finite loss or gradient on some rank)."""
        if self.now is not None:
            return self._finish_fresh(optimizer, guard, loss, step)
        self.grads.check_views()
        if guard is not None:
            assert self.grads.tail is not None, "the guard's flags ride in the tail"
            guard.fold(loss, self.grads.tail)
        slot = 1 - self._slot if self.pending is not None else self._slot
        mine = self.wire[slot]
        for dt, b in self.grads.buffers.items():
            mine[dt].copy_(b)
        sent = dist.allreduce_buffers_start(
            list(mine.values()), [f"delayed.{slot}.{_dtype_name(dt)}" for dt in mine], "avg"
        )
        # the previous step's average (it travelled while this step computed), if any
        skipped = self._apply(optimizer, guard) if self.pending is not None else False
        self._handle, self._slot, self.pending = sent, slot, step
        return skipped

    def _finish_fresh(
        self, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard | None, loss: Tensor, step: int
    ) -> bool:
        """``finish`` with fresh parameters: this step's fresh average (waited for, with the guard's flags) and the
        previous step's late average go into one optimizer step. A skipped step's late gradient is never applied."""
        now = self.now
        assert now is not None, "called with fresh parameters only"
        now.check_views()
        self.grads.check_views()
        if guard is not None:
            assert now.tail is not None, "the guard's flags ride in the fresh buffers' tail"
            guard.fold(loss, now.tail[: self._flags])
        if self.half is not None:  # this rank's max |late gradient|, averaged with the fresh gradient
            assert now.tail is not None, "the fp16 wire's bound rides in the fresh buffers' tail"
            peak = torch.stack([torch.linalg.vector_norm(b, float("inf")).float() for b in self.grads.buffers.values()])
            peak = peak.max()  # max |g| without a copy of the buffer (NaN and inf stay non-finite)
            now.tail.narrow(0, self._flags, 1).copy_(peak.reshape(1))
        # the small fresh average first, waited for, so that Horovod cannot fuse it with the grid's large one
        now.allreduce_()
        slot = 1 - self._slot if self.pending is not None else self._slot
        sent = self._send(slot)
        skipped = guard.should_skip(optimizer, step, grads=now) if guard is not None else False
        spec = self.speculative
        if spec is not None:  # theta back in the parameters, this rank's late gradient kept for w
            spec.rewind()
            if not skipped:
                spec.stash()
        late = self.pending is not None and self._late_ok
        if late:
            self._land()
            if not skipped and not self.grads.all_finite():
                late = False
        if not skipped:
            if late:
                optimizer.step()
            else:  # the late parameters sit this update out (the first step, or after a skipped one)
                _step_without(self.grads, optimizer)
            if spec is not None:  # w for the next step: theta + the step this rank's gradient would make
                spec.speculate(spec.anchor)
        self._wait()
        self._handle, self._slot, self.pending, self._late_ok = sent, slot, step, not skipped
        return skipped

    def _send(self, slot: int) -> dist.PendingAllreduce:
        """(fresh mode) Start the allreduce of the late gradient in wire ``slot``: float32 averaged, or the fp16
        wire's fp16(g * s / N) summed (``self.now``'s tail holds the bound, already averaged)."""
        mine = self.wire[slot]
        for dt, b in self.grads.buffers.items():
            mine[dt].copy_(b)
        if self.half is None:
            return dist.allreduce_buffers_start(
                list(mine.values()), [f"delayed.{slot}.{_dtype_name(dt)}" for dt in mine], "avg"
            )
        assert self.now is not None and self.now.tail is not None, "the bound rides in the fresh buffers' tail"
        scale = self._scales[slot] = fp16_scale(self.now.tail[-1].clone())
        factor = scale / (dist.runtime().size if dist.communicating() else 1)
        half = self.half[slot]
        for dt, w in mine.items():
            half[dt].copy_(w.mul_(factor))  # the float32 slot is scratch until the sum is decoded into it
        return dist.allreduce_buffers_start(
            list(half.values()), [f"delayed.{slot}.fp16.{_dtype_name(dt)}" for dt in half], "sum"
        )

    def _land(self) -> None:
        """Wait for the pending average and put it in the gradient buffers (every late ``p.grad``)."""
        self._wait()
        for dt, b in self.grads.buffers.items():
            b.copy_(self.wire[self._slot][dt])

    def _apply(self, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard | None) -> bool:
        """Wait for the pending average, put it in ``p.grad`` and step unless the guard skips it (-> skipped)."""
        self._land()
        skipped = False
        if guard is not None:
            assert self.grads.tail is not None and self.pending is not None, "an average in flight, with its flags"
            guard.adopt(self.grads.tail)
            skipped = guard.should_skip(optimizer, self.pending, grads=self.grads)
        if not skipped:
            optimizer.step()
        return skipped

    def settle(self) -> None:
        """Collective: the average in flight lands (before a checkpoint reads it). With delay compensation a sync
        point: every rank makes w from the pending average instead of its own gradient."""
        self._wait()
        self._speculate_from_average()

    def _speculate_from_average(self) -> None:
        """(delay compensation) w = theta + the step the pending average would make (theta alone when none is
        pending, or it belongs to a skipped step): the same on every rank."""
        if self.speculative is None:
            return
        self.speculative.rewind()
        if self.pending is not None and self._late_ok:
            self._land()
            self.speculative.speculate(self.speculative.grads())

    def flush(self, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard | None) -> bool:
        """The end of training (collective): the last average is applied, so n steps make n updates.
        Returns whether an update was applied (the caller then updates the parameter average)."""
        if self.speculative is not None:
            self.speculative.rewind()
        if self.pending is None:
            return False
        if self.now is not None:  # the late parameters' last average alone
            self._land()
            applied, self.pending = self._late_ok and self.grads.all_finite(), None
            if applied:
                _step_without(self.now, optimizer)
            return applied
        skipped = self._apply(optimizer, guard)
        self.pending = None
        return not skipped

    @contextlib.contextmanager
    def consensus(self) -> Iterator[None]:
        """Inside: the parameters every rank shares (with delay compensation theta, not this rank's w)."""
        if self.speculative is None:
            yield  # every rank already holds the same parameters
            return
        with self.speculative.swapped():
            yield

    def anchored(self, tensors: list[Tensor]) -> list[Tensor]:
        """``tensors`` (parameters) as every rank shares them: with delay compensation theta in place of w."""
        return self.speculative.anchored(tensors) if self.speculative is not None else tensors

    def anchor_state(self) -> dict[str, Tensor]:
        """Parameters by name that a checkpoint saves in place of the field's own (delay compensation: theta)."""
        return self.speculative.state() if self.speculative is not None else {}

    def state_dict(self) -> dict:
        """The average not yet applied (identical on every rank; ``settle`` first)."""
        if self.pending is None:
            return {"mode": self.mode, "pending": -1}
        return {
            "mode": self.mode,
            "pending": int(self.pending),
            "late_ok": self._late_ok,
            "buffers": {_dtype_name(dt): t.detach().to("cpu").clone() for dt, t in self.wire[self._slot].items()},
        }

    def restore(self, state: dict | None) -> str:
        """Collective: rank 0's checkpointed ``state`` (others: None) -> the average to apply at the next step.
        Returns a note for the log ("" when nothing to say)."""
        self.grads.attach()  # Horovod's optimizer-state broadcast gives an empty state new ``p.grad`` tensors
        if self.now is not None:
            self.now.attach()
        meta: dict | None = None
        if dist.runtime().is_root:
            meta = {
                "mode": (state or {}).get("mode"),
                "pending": int((state or {}).get("pending", -1)),
                "late_ok": bool((state or {}).get("late_ok", True)),
            }
        meta = dist.broadcast_object(meta, name="gradsync.meta")
        assert meta is not None, "rank 0 broadcasts the checkpoint's gradient-sync state"
        self._handle, self.pending = None, None
        if self.speculative is not None:
            self.speculative.ahead = False  # the broadcast put the checkpoint's theta in the parameters
        if meta["mode"] != self.mode or meta["pending"] < 0:
            return (
                ""
                if meta["mode"] in (None, self.mode)
                else f"taken with --grad_sync {meta['mode']}: no average in flight"
            )
        slot = self.wire[self._slot]
        for dt, t in slot.items():
            if dist.runtime().is_root:
                assert state is not None, "rank 0 holds the checkpoint"
                t.copy_(state["buffers"][_dtype_name(dt)])
            dist.broadcast_(t, name=f"gradsync.{_dtype_name(dt)}")
        self.pending, self._late_ok = meta["pending"], meta["late_ok"]
        self._speculate_from_average()  # as the run that wrote the checkpoint did at it
        return ""


class PeriodicAveraging:
    """Local steps, parameters and optimizer moments averaged after every ``period``-th step (see the module
    docstring). ``ema``: the parameter average (``optim.ParameterEma``) or None."""

    mode = "periodic"

    def __init__(self, field: torch.nn.Module, optimizer: torch.optim.Optimizer, period: int, ema=None) -> None:
        if period < 1:
            raise ValueError(f"the sync period must be >= 1, got {period}")
        self.field, self.optimizer, self.period, self.ema = field, optimizer, period, ema
        self.synced = True  # every rank holds the same state (at the start: broadcast from rank 0)
        self.syncs = 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def finish(self, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard | None, loss: Tensor, step: int) -> bool:
        """After step ``step``'s backward (1-based, collective): the local update, then the average when due."""
        skipped = False
        if guard is not None:
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            # a non-finite local gradient poisons the flag (0 * inf = nan): every rank skips together
            probe = loss.detach().float()
            if grads:
                probe = probe + 0.0 * torch.stack([g.float().sum() for g in grads]).sum()
            guard.submit(probe)
            skipped = guard.should_skip(optimizer, step, check_gradients=False)
        if not skipped:
            optimizer.step()
            self.synced = False
        if step % self.period == 0:
            self.sync()
        return skipped

    def tensors(self) -> list[Tensor]:
        """What a sync averages: parameters, per-parameter optimizer state, the parameter average."""
        out = [p.data for p in self.field.parameters()]
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                st = self.optimizer.state.get(p, {})
                out += [
                    st[k]
                    for k in sorted(st)
                    if isinstance(st[k], Tensor) and st[k].shape == p.shape and st[k].is_floating_point()
                ]
        if self.ema is not None:
            out += list(self.ema.average)
        return out

    @torch.no_grad()
    def sync(self) -> None:
        """Collective: every rank's parameters, moments and parameter average replaced by their rank average."""
        if dist.communicating():
            dist.allreduce_many_(self.tensors(), "avg", name="periodic")
        self.synced = True
        self.syncs += 1

    def settle(self) -> None:
        """Before a checkpoint (collective): a checkpoint is a sync point."""
        if not self.synced:
            self.sync()

    def flush(self, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard | None) -> bool:
        """The end of training: one model on every rank (no update: returns False)."""
        self.settle()
        return False

    @contextlib.contextmanager
    def consensus(self) -> Iterator[None]:
        """Collective: inside, the rank average of the parameters (and of the parameter average), without
        changing any rank's own state (an evaluation between syncs)."""
        if self.synced or not dist.communicating():
            yield
            return
        live = [p.data for p in self.field.parameters()] + (list(self.ema.average) if self.ema is not None else [])
        saved = [t.clone() for t in live]
        with torch.no_grad():
            dist.allreduce_many_(live, "avg", name="periodic.consensus")
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(live, saved)

    def anchored(self, tensors: list[Tensor]) -> list[Tensor]:
        return tensors  # the parameter average follows each rank's own parameters, averaged at syncs

    def anchor_state(self) -> dict[str, Tensor]:
        return {}  # a checkpoint is a sync point: the parameters are the shared ones

    def state_dict(self) -> dict:
        return {"mode": self.mode, "period": self.period}

    def restore(self, state: dict | None) -> str:
        """Collective (nothing to broadcast: a checkpoint is a sync point, its state is the shared one)."""
        self.synced = True
        taken = dist.broadcast_object(
            (state or {}).get("mode") if dist.runtime().is_root else None, name="gradsync.meta"
        )
        return "" if taken in (None, self.mode) else f"taken with --grad_sync {taken}"


#: the ``--grad_sync`` modes that take the gradient exchange off Horovod's DistributedOptimizer
Exchange = DelayedAveraging | PeriodicAveraging


def make_exchange(
    comm: CommSettings, field: NGPField, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard | None, ema=None
) -> Exchange | None:
    """The exchange ``--grad_sync`` asks for; None for ``every`` (Horovod's DistributedOptimizer)."""
    if comm.grad_sync == "delayed":
        return DelayedAveraging(field.named_parameters(), guard)
    if comm.grad_sync == "delayed_grid":
        wire = "fp16" if comm.compression == "fp16" else "fp32"
        spec = optimizer if comm.delay_compensation == "local" else None
        delayed = DelayedAveraging(
            field.named_parameters(), guard, fresh=field.mlp_parameters(), wire=wire, speculate_with=spec
        )
        delayed.mode = "delayed_grid"
        return delayed
    if comm.grad_sync == "periodic":
        return PeriodicAveraging(field, optimizer, comm.sync_period, ema)
    return None


__all__ = ["DelayedAveraging", "Exchange", "PeriodicAveraging", "SpeculativeGrid", "fp16_scale", "make_exchange"]
