"""Failure handling: agreed skipping of non-finite steps, a progress watchdog, and fast, named exits.

What the launchers already do (measured, 2 ranks on one machine, a rank killed or raising mid-run):
horovodrun (Gloo or MPI controller) and plain ``mpirun`` end the whole job within about 10 s once
any rank *exits* non-zero, and print which process did. What they cannot do, and this module adds:

- a rank whose Python raised may hang in interpreter shutdown (Horovod's exit handler waits for
  its background thread): ``report`` (through ``errors.run_cli``) prints one line naming the rank, and the
  process leaves at once;
- a rank that is alive but stuck leaves the others blocked in a collective forever: the
  ``Watchdog`` ends its own rank when no step finished for ``timeout_s`` seconds;
- a NaN/Inf loss or gradient on one rank would poison every rank's parameters through the
  allreduce: ``NonFiniteGuard`` makes all ranks skip that step together and stops the run after
  ``limit`` non-finite steps in a row.

Exit codes: 2 user-facing error (``HvdNgpError``), 1 unexpected exception or a collective aborted
because another rank failed, 3 watchdog timeout, 75 stopped by a signal with a checkpoint and steps
left (``preempt.EXIT_PREEMPTED``: resume with ``--resume auto``), 128 + N a second signal N during
that stop (e.g. 143: SIGTERM), 130 interrupted (SIGINT when ``--stop_signals`` leaves INT out).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
import traceback
from typing import Callable, Iterator

import torch

from ..cluster import dist
from ..cluster.flatgrad import FlatGradients
from ..errors import HvdNgpError
from ..launcher_env import launcher_rank_label

EXIT_CRASH = 1
EXIT_WATCHDOG = 3
EXIT_INTERRUPTED = 130


class NonFiniteError(HvdNgpError):
    """Too many consecutive steps with a non-finite loss or gradients."""


# ------------------------------------------------------------------------------------ NaN / Inf


class NonFiniteGuard:
    """Agree on every rank whether this step's loss or gradients are non-finite; skip such steps.

    Per step: ``submit(loss)`` before backward starts one tiny allreduce of "my loss is not
    finite" (Horovod fuses it with the gradients), or ``fold(loss, flat.tail)`` writes the flag
    into the flat gradient buffer's tail (``cluster.flatgrad``), reduced with it; ``should_skip``
    after the gradient allreduce reads that flag and checks the *reduced* gradients, the same bits on every
    rank, so every rank reaches the same verdict with no further communication. After ``limit``
    non-finite steps in a row it raises ``NonFiniteError`` (on every rank at the same step).
    With an fp16 gradient scaler, non-finite gradients are the scaler's business (it skips the
    step and lowers the scale); only a non-finite loss counts here.
    """

    def __init__(self, limit: int, stop_requested: Callable[[], bool] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"the non-finite step limit must be >= 1, got {limit}")
        self.limit = limit
        self.consecutive = 0
        self.skipped: list[int] = []
        self._handle = None
        self._folded: torch.Tensor | None = None  # the tail holding this step's flags (``fold``)
        # the preemption flag (``preempt``) rides along: [loss not finite, stop requested], one message
        self._stop_requested = stop_requested
        self.stop_agreed = False

    @property
    def carries_stop(self) -> bool:
        return self._stop_requested is not None

    @property
    def width(self) -> int:
        """Floats reduced per step: ``[loss not finite]``, or ``[loss not finite, stop requested]``."""
        return 1 if self._stop_requested is None else 2

    def flags(self, loss: torch.Tensor) -> torch.Tensor:
        """This rank's flags ``[width]`` float32 on ``loss``'s device (0 or 1 each); no collective."""
        flag = torch.empty(self.width, device=loss.device)
        self._write(loss, flag)
        return flag

    def _write(self, loss: torch.Tensor, out: torch.Tensor) -> None:
        out[0] = (~torch.isfinite(loss.detach())).float()
        if self._stop_requested is not None:
            write_flag(out, 1, self._stop_requested())

    def submit(self, loss: torch.Tensor) -> None:
        """Start this step's Max-allreduce of the flags (Horovod fuses it with the gradients)."""
        self._folded = None
        self._handle = dist.allreduce_async(self.flags(loss), "max", name="failures.nonfinite_loss")

    def fold(self, loss: torch.Tensor, tail: torch.Tensor) -> None:
        """Write this rank's flags into ``tail`` ``[width]`` instead of submitting them.

        ``tail`` is reduced with the gradients (``cluster.flatgrad.FlatGradients.tail``: one
        collective per step, flags included). Averaged or summed, any rank's 1 stays > 0, which
        is all ``should_skip`` reads. Call after backward and before the gradient allreduce.
        """
        if tail.shape != (self.width,) or tail.dtype != torch.float32:
            raise ValueError(f"the guard's tail must be float32 [{self.width}], got {tail.dtype} {list(tail.shape)}")
        self._handle = None
        self._write(loss, tail)
        self._folded = tail

    def fold_stop(self, tail: torch.Tensor, zeroed: bool = False) -> None:
        """Write only the stop flag into ``tail[1]`` (the loss flag is already there: a graphed step writes
        it on the device, ``training.graphed``). ``zeroed``: ``tail[1]`` is known to be 0 (the graphed step
        zeroes the tail every step), so only a requested stop is written: no kernel on an ordinary step."""
        if self._stop_requested is not None:
            stop = self._stop_requested()
            if stop or not zeroed:
                write_flag(tail, 1, stop)

    def adopt(self, tail: torch.Tensor) -> None:
        """This step's flags are in ``tail`` ``[width]`` already (written on the device and reduced with the
        gradients): ``should_skip`` reads them from there."""
        if tail.shape != (self.width,) or tail.dtype != torch.float32:
            raise ValueError(f"the guard's tail must be float32 [{self.width}], got {tail.dtype} {list(tail.shape)}")
        self._handle = None
        self._folded = tail

    def should_skip(
        self,
        optimizer: torch.optim.Optimizer,
        step: int,
        check_gradients: bool = True,
        grads: FlatGradients | None = None,
    ) -> bool:
        """Call after the gradient allreduce (``optimizer.synchronize()`` or ``FlatGradients.allreduce_``);
        identical on every rank. ``grads``: check these flat buffers instead of the optimizer's gradients."""
        if self._folded is not None:
            flags = self._folded.tolist()  # reduced with the gradients; one host sync
        elif self._handle is not None:
            flags = dist.synchronize(self._handle).tolist()  # one host sync, as before
        else:
            raise RuntimeError("NonFiniteGuard.should_skip before submit() or fold() this step")
        self._handle = self._folded = None
        grads_bad = (
            check_gradients
            and not flags[0] > 0
            and not (grads.all_finite() if grads is not None else all_finite(optimizer))
        )
        return self.decide(flags, step, grads_bad)

    def decide(self, flags: list[float], step: int, grads_bad: bool = False) -> bool:
        """The verdict on ``step`` from its reduced flags (host floats; ``should_skip`` reads them, a graphed
        step deferring its verdict reads them one step later): skip it? Counts, logs and raises as
        ``should_skip`` says; sets ``stop_agreed``."""
        loss_bad = flags[0] > 0
        self.stop_agreed = len(flags) > 1 and flags[1] > 0
        if not (loss_bad or grads_bad):
            self.consecutive = 0
            return False
        self.consecutive += 1
        self.skipped.append(step)
        what = "loss" if loss_bad else "gradients"
        dist.log(
            f"[step {step}] warning: non-finite {what} on at least one rank: step skipped on every rank "
            f"({self.consecutive} in a row, limit {self.limit})"
        )
        if self.consecutive >= self.limit:
            first = step - self.consecutive + 1
            raise NonFiniteError(
                f"non-finite loss or gradients in {self.consecutive} consecutive steps "
                f"({first}-{step}); stopping. Lower the learning rate, check the scene's images and "
                f"poses, or raise --nonfinite_limit"
            )
        return True


def write_flag(flags: torch.Tensor, index: int, value: bool) -> None:
    """``flags[index] = value`` on the device without a host sync: a fill kernel on a one-element slice.

    ``flags[index] = float(value)`` copies a CPU scalar into the tensor and, with torch 2.11 on CUDA,
    synchronises the stream first: the host waited there for the whole step every step (4.4 ms of a
    5.8 ms step late in lego training on one H100, where the graphed step writes the stop flag)."""
    flags.narrow(0, index, 1).fill_(float(value))


def all_finite(optimizer: torch.optim.Optimizer) -> bool:
    """True when every gradient held by ``optimizer`` is finite (one host sync)."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return True
    return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


# ------------------------------------------------------------------------------------ watchdog


class Watchdog:
    """Ends this process when, while armed, no ``kick()`` came for ``timeout_s`` seconds (0: off).

    The training loop runs inside ``armed()`` and kicks it every step; phases inside the loop that
    may legitimately take long (evaluation, writing a checkpoint) run inside ``paused()``. Outside
    the loop (start-up, an elastic re-rendezvous, the final evaluation) it never fires. On timeout
    it prints one line naming the rank and the last step, dumps the Python stack (where it was
    stuck), and exits with status 3, so the launcher ends the other ranks too.
    """

    def __init__(self, timeout_s: float, rank: int) -> None:
        self.timeout_s, self.rank = float(timeout_s), rank
        self._last = time.monotonic()
        self._step = 0
        self._armed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Watchdog":
        if self.timeout_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="hvd_ngp-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def kick(self, step: int) -> None:
        self._step, self._last = step, time.monotonic()

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        self._armed += 1
        self._last = time.monotonic()
        try:
            yield
        finally:
            self._armed -= 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._armed -= 1
        try:
            yield
        finally:
            self._armed += 1
            self._last = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(min(5.0, max(self.timeout_s / 4, 0.2))):
            if self._armed <= 0 or time.monotonic() - self._last < self.timeout_s:
                continue
            print(
                f"[rank {self.rank}] hvd_ngp: error: no training step finished for {self.timeout_s:g} s "
                f"(last finished: step {self._step}); another rank has probably died or hung, or this one is "
                f"stuck (stack below). Stopping this rank; raise --watchdog_s if steps are this slow.",
                file=sys.stderr,
                flush=True,
            )
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            os._exit(EXIT_WATCHDOG)


# ------------------------------------------------------------------------------------ exits


def rank_label() -> str:
    """``"[rank N] "`` from the runtime or the launcher's environment; empty for a size-1 run."""
    try:
        rt = dist.runtime()
        return f"[rank {rt.rank}] " if rt.size > 1 or dist.launched() else ""
    except RuntimeError:
        return launcher_rank_label()


def report(exc: BaseException) -> int:
    """Print one clear message for ``exc`` on stderr and return the exit status to use."""
    where = rank_label()
    if isinstance(exc, HvdNgpError):
        print(f"{where}hvd_ngp: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if isinstance(exc, KeyboardInterrupt):
        print(f"{where}hvd_ngp: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if dist.is_collective_failure(exc):
        print(
            f"{where}hvd_ngp: error: stopping because another rank failed (a collective was aborted: "
            f"{str(exc).splitlines()[0][:160]}); that rank's own message is above",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_CRASH
    frames = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6))
    print(
        f"{where}hvd_ngp: fatal: unexpected {type(exc).__name__} (a bug, or a failure of the machine): {exc}\n{frames}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_CRASH
