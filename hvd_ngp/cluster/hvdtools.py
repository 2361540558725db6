"""Horovod's own diagnostics switched on from hvd_ngp options: timeline, autotuner, stall check.

Horovod reads these settings from environment variables when it initialises (the autotuner's
sampling knobs even when it is imported), so ``apply`` must run before ``dist.init()``. Each
option only sets its variable when given; variables the user exported (or that ``horovodrun
--timeline-filename``/``--autotune`` set) are otherwise left alone.

- ``--timeline_file PATH``: ``HOROVOD_TIMELINE``. Rank 0 (Horovod's coordinator) writes a Chrome trace
  of every collective, with what all ranks did (``--timeline_mark_cycles`` adds Horovod's cycles).
- ``--autotune``: ``HOROVOD_AUTOTUNE=1``; Horovod's Bayesian optimiser tries fusion thresholds,
  cycle times, hierarchical allreduce/allgather and the response cache; ``--autotune_log PATH``
  (``HOROVOD_AUTOTUNE_LOG``, rank 0) records each tried setting with its score.
- ``--stall_check_s N``: warn when some ranks have waited N s for others to submit the same
  tensor (``HOROVOD_STALL_CHECK_TIME_SECONDS``; 0 switches the check off); ``--stall_shutdown_s M``
  ends the job after M s of such a stall (``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import ConfigError
from . import dist


def horovod_tool_env(
    timeline: str | None = None,
    timeline_mark_cycles: bool = False,
    autotune: bool = False,
    autotune_log: str | None = None,
    stall_check_s: int | None = None,
    stall_shutdown_s: int | None = None,
) -> dict[str, str]:
    """The Horovod environment variables these options stand for (paths made absolute and checked)."""
    env: dict[str, str] = {}
    if timeline:
        env["HOROVOD_TIMELINE"] = _writable("--timeline_file", timeline)
        if timeline_mark_cycles:
            env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    elif timeline_mark_cycles:
        raise ConfigError("--timeline_mark_cycles needs --timeline_file PATH")
    if autotune or autotune_log:
        env["HOROVOD_AUTOTUNE"] = "1"
        if autotune_log:
            env["HOROVOD_AUTOTUNE_LOG"] = _writable("--autotune_log", autotune_log)
    if stall_check_s is not None:
        if stall_check_s < 0:
            raise ConfigError(f"--stall_check_s must be >= 0 (0 switches the check off), got {stall_check_s}")
        if stall_check_s == 0:
            env["HOROVOD_STALL_CHECK_DISABLE"] = "1"
        else:
            env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(stall_check_s)
    if stall_shutdown_s is not None:
        warn_after = 60 if stall_check_s is None else stall_check_s  # Horovod's default warning time
        if stall_shutdown_s < 0:
            raise ConfigError(f"--stall_shutdown_s must be >= 0 (0: never), got {stall_shutdown_s}")
        if stall_shutdown_s and (warn_after == 0 or stall_shutdown_s < warn_after):
            # Horovod itself would only log a warning and never shut down
            raise ConfigError(
                f"--stall_shutdown_s {stall_shutdown_s} needs the stall check on, with "
                f"--stall_check_s <= {stall_shutdown_s} (it is {warn_after})"
            )
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(stall_shutdown_s)
    return env


def _writable(option: str, path: str) -> str:
    p = Path(path).expanduser().resolve()
    try:  # like --out_dir: a missing folder is made (every rank may try; exist_ok)
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot create the folder {p.parent}: {exc.strerror}") from None
    if not os.access(p.parent, os.W_OK):
        raise ConfigError(f"{option} {path}: folder {p.parent} is not writable")
    return str(p)


def apply(tools) -> dict[str, str]:
    """Export the variables for ``tools`` (before ``dist.init``): anything with this group's options as
    attributes (``settings.RuntimeSettings``; a parsed Namespace); returns what was set."""
    env = horovod_tool_env(
        tools.timeline,
        tools.timeline_mark_cycles,
        tools.autotune,
        tools.autotune_log,
        tools.stall_check_s,
        tools.stall_shutdown_s,
    )
    os.environ.update(env)
    if env and not dist.launched():
        dist.log(
            f"hvd_ngp: note: {', '.join(sorted(env))} set, but a size-1 run without a launcher does not "
            "start Horovod: nothing will be written (run under horovodrun/mpirun)"
        )
    return env


def add_options(p: argparse.ArgumentParser) -> None:
    """Declare the Horovod tools option group (turned into variables by ``apply``)."""
    g = p.add_argument_group("Horovod's tools: timeline, autotuner, stall check")
    g.add_argument(
        "--timeline_file",
        dest="timeline",
        default=None,
        metavar="PATH",
        help="Horovod timeline (Chrome trace, written by rank 0). Not '--timeline': horovodrun "
        "rejects that as an ambiguous prefix of its own options",
    )
    g.add_argument("--timeline_mark_cycles", action="store_true", help="mark Horovod's cycles in the timeline")
    g.add_argument(
        "--autotune",
        action="store_true",
        help="let Horovod's autotuner search fusion threshold, cycle time and hierarchical allreduce",
    )
    g.add_argument(
        "--autotune_log",
        default=None,
        metavar="PATH",
        help="CSV of every setting the autotuner tried and its score (rank 0; implies --autotune)",
    )
    g.add_argument(
        "--stall_check_s",
        type=int,
        default=None,
        metavar="N",
        help="warn when ranks wait more than N s for each other in a collective (Horovod default 60; 0: off)",
    )
    g.add_argument(
        "--stall_shutdown_s",
        type=int,
        default=None,
        metavar="N",
        help="stop the job after a stall of N s (Horovod default 0: never)",
    )
