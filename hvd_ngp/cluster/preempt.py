"""Preemption-safe stops: a scheduler's or operator's signal becomes a checkpoint and a documented exit.

SIGTERM, SIGINT and SIGUSR1 (``--stop_signals``) reaching *any* rank set a local flag. The flag is
agreed by a collective every rank runs in the same order, so every rank stops after the same
step, writes one checkpoint (the atomic writer of ``checkpoint``), rank 0 writes
``<out_dir>/preempted.json``, and every rank exits with ``EXIT_PREEMPTED`` (75, EX_TEMPFAIL:
"stopped early, run me again with --resume auto"). Under ``hvd-ngp-launch`` (``SUPERVISED_ENV`` set) the ranks
exit 0 instead and the launcher, which reads the marker, exits 75 (``stop_exit_status``): Open MPI's mpirun
answers ranks that all exit non-zero at once by waiting ``odls_base_sigkill_timeout`` twice for processes
already gone (40 s with the job scripts' 20 s, measured with Open MPI 4.1.4), which a scheduler's 90 s warning
cannot spare.

Which collective carries the flag:

- with the non-finite guard (``--nonfinite_limit`` > 0, the default), its per-step allreduce of a
  "loss not finite" flag becomes a 2-element tensor ``[loss not finite, stop requested]``; it is
  submitted with the gradients and fused with them by Horovod, so the flag costs no extra message;
- without the guard, a 1-element allreduce every ``EVERY_STEPS`` (8) steps;
- at size 1, no collective: the flag is read every step.

A second signal more than ``DUPLICATE_S`` seconds after the first exits at once with status
128 + signal number (e.g. 143 for SIGTERM): an interrupted checkpoint write leaves only its
temporary file, and the previous checkpoint stays valid. Signals closer together than that count
as one: a launcher that forwards a signal the rank also received directly (SLURM signals every
process of a job step, and so does mpirun) delivers it twice.

Under an elastic horovodrun the handlers are not installed (Horovod's elastic driver manages its
workers; a log line says so): stop elastic jobs with ``--commit_every`` and ``--ckpt_every`` instead.

Imports nothing heavy at module level (``hvd_ngp.tools.launch`` reads the exit status from here).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable

EXIT_PREEMPTED = 75  # EX_TEMPFAIL (sysexits.h): training has steps left; resume with --resume auto
DEFAULT_SIGNALS = "TERM,INT,USR1"
EVERY_STEPS = 8  # cadence of the stand-alone stop vote when no per-step collective carries the flag
DUPLICATE_S = 2.0
MARKER = "preempted.json"
#: set by ``hvd-ngp-launch`` for its ranks: it turns the marker into exit status 75 itself
SUPERVISED_ENV = "HVD_NGP_SUPERVISED"
#: what ``signal.signal`` takes and gives back: a function, ``SIG_DFL`` / ``SIG_IGN`` (ints), None (not set by Python)
SignalHandler = Callable[[int, FrameType | None], Any] | int | None


def stop_exit_status() -> int:
    """A rank's exit status after a stop with a checkpoint: ``EXIT_PREEMPTED``, or 0 under ``hvd-ngp-launch``
    (``SUPERVISED_ENV``), whose own status is then ``EXIT_PREEMPTED`` (see the module docstring)."""
    return 0 if os.environ.get(SUPERVISED_ENV) == "1" else EXIT_PREEMPTED


def parse_signals(text: str) -> tuple[str, ...]:
    """``"TERM,INT,USR1"`` -> ``("TERM", "INT", "USR1")`` ("SIG" prefixes and case ignored); "none" -> ()."""
    text = (text or "").strip()
    if text.lower() in ("", "none", "off"):
        return ()
    names = []
    for part in text.split(","):
        name = part.strip().upper().removeprefix("SIG")
        if name in ("KILL", "STOP"):
            raise ValueError(f"SIG{name} cannot be caught")
        if f"SIG{name}" not in signal.Signals.__members__:  # not SIG_IGN, SIG_DFL or SIG_BLOCK
            raise ValueError(f"unknown signal {part.strip()!r} (e.g. TERM, INT, USR1, USR2, HUP)")
        if name not in names:
            names.append(name)
    return tuple(names)


class Interrupted(Exception):
    """A stop request cut an evaluation or render short between two chunks (``interruption_point``)."""


_watched: "StopSignals | None" = None  # the run's handlers while an evaluation may be cut short (``interruptible``)


class interruptible:
    """Context: inside it, ``interruption_point`` raises ``Interrupted`` once ``signals`` hold a stop request.
    Only around work without collectives between its chunks (each rank may stop at another chunk)."""

    def __init__(self, signals: "StopSignals | None") -> None:
        self.signals = signals

    def __enter__(self) -> None:
        global _watched
        self._outer, _watched = _watched, self.signals

    def __exit__(self, *exc) -> None:
        global _watched
        _watched = self._outer


def interruption_point() -> None:
    """Between chunks of a render: raise ``Interrupted`` when this rank was asked to stop (inside ``interruptible``)."""
    if _watched is not None and _watched.pending():
        raise Interrupted(_watched.received)


class StopSignals:
    """Handlers that turn the first stop signal into a flag and a later one into an immediate exit."""

    def __init__(self, names: tuple[str, ...], rank: int = 0) -> None:
        self.names, self.rank = names, rank
        self.received: str | None = None  # the first signal's name (SIGTERM, ...), on this rank
        self._first_at = 0.0
        self._previous: dict[int, SignalHandler] = {}  # signal number -> the handler installed before ours

    def install(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self  # Python delivers signals to the main thread only
        for name in self.names:
            num = getattr(signal, f"SIG{name}")
            self._previous[num] = signal.signal(num, self._handle)
        return self

    def uninstall(self) -> None:
        for num, old in self._previous.items():
            signal.signal(num, old)
        self._previous.clear()

    def pending(self) -> bool:
        return self.received is not None

    def request(self, why: str) -> None:
        """A stop asked for by something other than a signal (the launcher died: ``LauncherWatch``)."""
        if self.received is None:
            self.received, self._first_at = why, time.monotonic()
            self._say(f"{why}: stopping every rank at the next step boundary with a checkpoint")

    def _say(self, text: str) -> None:
        # os.write: print() from a handler may re-enter a stream the main thread is writing
        try:
            os.write(2, f"[rank {self.rank}] hvd_ngp: {text}\n".encode())
        except OSError:
            pass

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.received is None:
            self.received, self._first_at = name, now
            self._say(
                f"received {name}: stopping every rank at the next step boundary with a checkpoint "
                f"(a second signal exits at once)"
            )
        elif now - self._first_at > DUPLICATE_S:
            self._say(
                f"received {name} while stopping (after {self.received}): exiting now without finishing "
                f"the checkpoint; the previous checkpoint is unchanged"
            )
            os._exit(128 + signum)


class StopVote:
    """The agreed stop decision (``decide``: the same answer on every rank at the same step)."""

    def __init__(self, signals: StopSignals | None, watch: "LauncherWatch | None" = None) -> None:
        self.signals, self.watch = signals, watch

    def uninstall(self) -> None:
        if self.signals is not None:
            self.signals.uninstall()
        if self.watch is not None:
            self.watch.stop()

    def local(self) -> bool:
        return self.signals is not None and self.signals.pending()

    def decide(self, step: int, guard=None) -> bool:
        """Collective when due. ``guard``: the non-finite guard whose per-step allreduce carried the flag."""
        from . import dist

        if self.signals is None:
            return False
        rt = dist.runtime()
        if rt.size == 1:
            return self.local()
        if guard is not None and guard.carries_stop:
            return guard.stop_agreed
        if step % EVERY_STEPS:
            return False
        import torch

        return float(dist.allreduce(torch.tensor([float(self.local())]), "max", name="preempt.stop")[0]) > 0

    def who(self) -> str:
        """Which signal(s) on which rank(s) asked to stop (collective; at stop time only)."""
        from . import dist

        mine = self.signals.received if self.signals is not None else None
        seen = dist.allgather_object(mine, name="preempt.who")
        found = [f"{name} on rank {r}" for r, name in enumerate(seen) if name]
        return ", ".join(found) or "another rank"


def install(names: tuple[str, ...], elastic: bool) -> StopVote:
    """The stop vote for this run: handlers for ``names``, or none (disabled, or an elastic job); under a
    launcher, a ``LauncherWatch`` that turns the launcher's death into a stop request (or, without handlers,
    into an exit)."""
    from . import dist

    rt = dist.runtime()
    if elastic:
        if names:
            dist.log(
                "stop signals: not handled in an elastic job (Horovod's elastic driver manages the workers); "
                "a signal ends the job as Horovod decides"
            )
        return StopVote(None)
    signals = StopSignals(names, rt.rank).install() if names else None
    return StopVote(signals, LauncherWatch.start(rt.rank, signals) if dist.launched() else None)


# ------------------------------------------------------------------------------------ the launcher's death

#: programs that start ranks; a rank watches each of these among its ancestors
LAUNCHER_NAMES = (
    "horovodrun",
    "mpirun",
    "mpiexec",
    "orterun",
    "prterun",
    "hvd-ngp-launch",
    "hvd_ngp.launch",
    "hvd_ngp.tools.launch",
)
WATCH_EVERY_S = 1.0


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time in clock ticks) of ``pid`` from /proc, or None when it is gone (or a zombie:
    dead, its status not yet collected by its parent)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return None if fields[0] in ("Z", "X") else (int(fields[1]), fields[19])


SHELLS = ("sh", "bash", "dash")


def _launcher_name(pid: int) -> str | None:
    try:
        argv = [arg.decode(errors="replace") for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return None
    if len(argv) >= 3 and os.path.basename(argv[0]) in SHELLS and argv[1] == "-c" and argv[2].split():
        # ``horovodrun --mpi`` execs ``/bin/sh -c "mpirun ..."``: the pid the user started (and may kill) is that
        # shell, and mpirun, its child, outlives it
        name = os.path.basename(argv[2].split()[0])
        return f"sh -c {name}" if name in LAUNCHER_NAMES else None
    for arg in argv[:4]:  # the program, or a script run by python (``python horovodrun``, ``-m hvd_ngp.launch``)
        name = os.path.basename(arg)
        if name in LAUNCHER_NAMES:
            return name
    return None


def launcher_ancestors(pid: int | None = None) -> list[tuple[int, str, str]]:
    """(pid, name, start time) of each launcher process above ``pid`` (default: this process), nearest first."""
    found, seen = [], set()
    current = _stat(pid or os.getpid())
    while current is not None and current[0] > 1 and current[0] not in seen:
        parent = current[0]
        seen.add(parent)
        current = _stat(parent)
        name = _launcher_name(parent)
        if name is not None and current is not None:
            found.append((parent, name, current[1]))
    return found


def output_lost(fd: int) -> bool:
    """Whether ``fd`` is a pipe whose reading end is closed: the launcher that forwarded this rank's output died
    (its next write would fail with EPIPE)."""
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
    try:
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def silence_lost_output() -> list[int]:
    """Point stdout and stderr (fds 1, 2) at /dev/null where their reader is gone -> the fds redirected, so the
    rank's later writes (and Python's flush at exit) no longer fail."""
    lost = [fd for fd in (1, 2) if output_lost(fd)]
    if lost:
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in lost:
            os.dup2(null, fd)
        os.close(null)
    return lost


class _SurvivingStream:
    """``sys.stdout``/``sys.stderr`` whose writes survive the death of their reader: a broken pipe calls ``lost``
    (which silences the fds and asks for a stop) and the write goes on to /dev/null."""

    def __init__(self, stream, lost) -> None:
        self._stream, self._lost = stream, lost

    def _retry(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            self._lost()
            try:
                return call(*args)
            except OSError:
                return None

    def write(self, text: str):
        return self._retry(self._stream.write, text)

    def flush(self) -> None:
        self._retry(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class LauncherWatch:
    """A thread that notices when the launcher above this rank is gone and asks for a stop with a checkpoint;
    without stop handlers (``--stop_signals none``) it ends the rank at once (exit 1), so no rank trains unwatched.

    "Gone" is either of: a launcher among this rank's ancestors exited (``kill -9`` of ``horovodrun --mpi``, which
    is ``/bin/sh -c mpirun``, leaves mpirun and the ranks running, reparented to init); or the pipe that carried
    this rank's stdout/stderr to the launcher lost its reader (``kill -9`` of mpirun or of horovodrun's Gloo
    driver): the thread sees that within ``WATCH_EVERY_S``, and a write that meets it first (``_SurvivingStream``)
    asks at once. Either way the rank's output then goes to /dev/null (``silence_lost_output``): the stop's
    outcome is in ``preempted.json``.
    """

    def __init__(self, rank: int, signals: StopSignals | None, launchers: list[tuple[int, str, str]]) -> None:
        self.rank, self.signals, self.launchers = rank, signals, launchers
        self._stop = threading.Event()
        self._asked = threading.Lock()

    @staticmethod
    def start(rank: int, signals: StopSignals | None) -> "LauncherWatch":
        watch = LauncherWatch(rank, signals, launcher_ancestors())
        sys.stdout = _SurvivingStream(sys.stdout, watch.output_gone)
        sys.stderr = _SurvivingStream(sys.stderr, watch.output_gone)
        threading.Thread(target=watch._run, name="hvd_ngp-launcher-watch", daemon=True).start()
        return watch

    def stop(self) -> None:
        self._stop.set()
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, _SurvivingStream):
                setattr(sys, name, stream._stream)

    def gone(self) -> tuple[int, str] | None:
        """The first watched launcher that has exited (or whose pid now names another process), or None."""
        for pid, name, started in self.launchers:
            now = _stat(pid)
            if now is None or now[1] != started:
                return pid, name
        return None

    def output_gone(self) -> None:
        """The launcher's end of this rank's output pipe is closed: silence the output and ask for a stop."""
        silence_lost_output()
        self._ask("the launcher's end of this rank's output pipe closed")

    def _ask(self, why: str) -> None:
        if not self._asked.acquire(blocking=False):
            return
        if self.signals is not None:
            self.signals.request(why)
        else:
            try:
                os.write(
                    2,
                    f"[rank {self.rank}] hvd_ngp: error: {why} and --stop_signals is none: exiting without "
                    f"a checkpoint\n".encode(),
                )
            except OSError:
                pass
            os._exit(1)

    def _run(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            dead = self.gone()
            if silence_lost_output() and dead is None:
                self._ask("the launcher's end of this rank's output pipe closed")
            if dead is not None:
                self._ask(f"the launcher {dead[1]} (pid {dead[0]}) is gone")
            if self._asked.locked():
                return


def write_marker(out_dir: Path, step: int, n_steps: int, signal_info: str, checkpoint: Path) -> None:
    """Rank 0: ``<out_dir>/preempted.json``, which says the run stopped early with steps left."""
    from . import dist

    if not dist.runtime().is_root:
        return
    info = {
        "step": step,
        "n_steps": n_steps,
        "signal": signal_info,
        "checkpoint": str(checkpoint),
        "exit_code": EXIT_PREEMPTED,
        "resume": "--resume auto",
        "time": time.time(),
    }
    tmp = out_dir / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, out_dir / MARKER)


def clear_marker(out_dir: Path) -> None:
    (out_dir / MARKER).unlink(missing_ok=True)
