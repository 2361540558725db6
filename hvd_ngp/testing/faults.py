"""Test-only fault injection, armed by the ``HVD_NGP_FAULTS`` environment variable (never by a flag);
the product reaches it only through the registry ``hvd_ngp.faultpoints``.

Failure handling is only trustworthy if tests can make real ranks fail on purpose. A fault is
``KIND@RANK:WHEN`` and several are separated by commas, e.g.
``HVD_NGP_FAULTS="nan_loss@1:10-14,raise@0:30"``.

step faults (``WHEN`` is a step ``S`` or a range ``A-B``, checked when step S starts on rank RANK):
    nan_loss   the rank's loss becomes NaN (so do its gradients)
    raise      the rank raises RuntimeError (an unexpected exception)
    exit       the rank calls ``os._exit(1)`` (dies without a message)
    kill       the rank sends itself SIGKILL
    hang       the rank sleeps forever (alive but stuck)
    slow       the rank sleeps SLOW_SECONDS_PER_SAMPLE per sample it rendered in the step (a slower GPU:
               its time grows with its work, so load balancing can even it out)
render faults (``WHEN`` is the N-th render chunk this process renders, from 1; evaluations render in chunks):
    slow_render  the chunk sleeps SLOW_RENDER_S first (slow work ahead of the stop check that opens each
                 render chunk: a long evaluation); the first one prints "fault: slow render chunk N"
checkpoint-write faults (``WHEN`` is the N-th checkpoint this process writes, from 1):
    save_enospc  the write fails with ENOSPC ("No space left on device") after 1 KiB
    save_pause   the write stops after 1 KiB, prints "fault: paused writing PATH" and sleeps forever
                 (a test then kills the job in the middle of the write)
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import BinaryIO

import torch

from ..cluster import dist
from ..errors import ConfigError

ENV = "HVD_NGP_FAULTS"  # also hvd_ngp.faultpoints.ENV: the registry that calls into this module when armed
STEP_KINDS = ("nan_loss", "raise", "exit", "kill", "hang", "slow")
SLOW_SECONDS_PER_SAMPLE = 10e-6
SAVE_KINDS = ("save_enospc", "save_pause")
RENDER_KINDS = ("slow_render",)
SLOW_RENDER_S = 1.0
_PARTIAL_BYTES = 1024


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    first: int
    last: int

    def hits(self, rank: int, when: int) -> bool:
        return rank == self.rank and self.first <= when <= self.last


def parse(text: str) -> list[Fault]:
    """``"nan_loss@1:3-5,raise@0:7"`` -> faults; a malformed entry is a ``ConfigError`` naming it."""
    faults = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        try:
            kind, rest = item.split("@", 1)
            rank, when = rest.split(":", 1)
            first, _, last = when.partition("-")
            fault = Fault(kind, int(rank), int(first), int(last or first))
        except ValueError:
            raise ConfigError(
                f"{ENV}: cannot parse {item!r} (expected KIND@RANK:STEP or KIND@RANK:FIRST-LAST)"
            ) from None
        known = STEP_KINDS + SAVE_KINDS + RENDER_KINDS
        if fault.kind not in known:
            raise ConfigError(f"{ENV}: unknown fault {fault.kind!r} in {item!r} (known: {', '.join(known)})")
        faults.append(fault)
    return faults


def armed() -> list[Fault]:
    return parse(os.environ.get(ENV, ""))


def _rank() -> int:
    try:
        return dist.runtime().rank
    except RuntimeError:  # not initialised (in-process tests): a size-1 run
        return 0


def _say(rank: int, text: str) -> None:
    print(f"[rank {rank}] fault: {text}", file=sys.stderr, flush=True)


def at_step(step: int) -> None:
    """Trigger the process-level step faults armed for this rank at ``step``; cheap when none is armed."""
    if ENV not in os.environ:
        return
    rank = _rank()
    for f in armed():
        if f.kind in ("nan_loss", "slow") or not f.hits(rank, step):
            continue
        _say(rank, f"{f.kind} at step {step}")
        if f.kind == "raise":
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        if f.kind == "exit":
            os._exit(1)
        if f.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if f.kind == "hang":
            while True:
                time.sleep(3600)


def slow_down(step: int, n_samples) -> None:
    """Sleep ``SLOW_SECONDS_PER_SAMPLE * n_samples`` when a ``slow`` fault is armed for this rank at ``step``."""
    if ENV in os.environ and any(f.kind == "slow" and f.hits(_rank(), step) for f in armed()):
        time.sleep(SLOW_SECONDS_PER_SAMPLE * int(n_samples))


def poison_loss(loss: torch.Tensor, step: int) -> torch.Tensor:
    """``loss * NaN`` when a ``nan_loss`` fault is armed for this rank at ``step``, else ``loss``."""
    if ENV in os.environ and any(f.kind == "nan_loss" and f.hits(_rank(), step) for f in armed()):
        return loss * float("nan")
    return loss


_chunks = 0
_said_slow = False


def render_chunk() -> None:
    """Before each render chunk: sleep ``SLOW_RENDER_S`` when a ``slow_render`` fault is armed for this chunk."""
    global _chunks, _said_slow
    if ENV not in os.environ:
        return
    _chunks += 1
    rank = _rank()
    if any(f.kind == "slow_render" and f.hits(rank, _chunks) for f in armed()):
        if not _said_slow:
            _said_slow = True
            _say(rank, f"slow render chunk {_chunks}")
        time.sleep(SLOW_RENDER_S)


_saves = 0


class _FaultyStream:
    """A binary file wrapper that fails (or stalls) after the first ``_PARTIAL_BYTES`` bytes."""

    def __init__(self, f: BinaryIO, kind: str, path: str, rank: int) -> None:
        self._f, self._kind, self._path, self._rank = f, kind, path, rank
        self._written = 0

    def write(self, data) -> int:
        if self._written >= _PARTIAL_BYTES:
            if self._kind == "save_enospc":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self._f.flush()
            _say(self._rank, f"paused writing {self._path}")
            while True:
                time.sleep(3600)
        n = self._f.write(data)
        self._written += len(data)
        return n

    def flush(self) -> None:
        self._f.flush()


def checkpoint_stream(f: BinaryIO, path: str) -> BinaryIO:
    """``f``, or a faulty wrapper when a checkpoint-write fault is armed for this process's next write."""
    global _saves
    if ENV not in os.environ:
        return f
    _saves += 1
    rank = _rank()
    for fault in armed():
        if fault.kind in SAVE_KINDS and fault.hits(rank, _saves):
            return _FaultyStream(f, fault.kind, path, rank)  # type: ignore[return-value]
    return f
