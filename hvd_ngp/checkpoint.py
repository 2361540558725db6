"""Snapshots: model, occupancy grid, optimizer state, step and config in one file.

Written by rank 0 atomically (temporary file in the same folder, fsync, rename), read with
``torch.load(weights_only=True)``, which refuses arbitrary pickled objects: the file holds only
tensors, numbers, strings and containers of them (the config is stored as a JSON string).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from .errors import SnapshotError

FORMAT = "hvd_ngp.snapshot.v1"


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to ``path`` so that a crash leaves either the old file or the new one, never half."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise SnapshotError(f"{path}: writing failed ({exc.strerror}); any previous file there is unchanged") from None
    return path


def snapshot_state(field: torch.nn.Module, grid: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
                   config: dict) -> dict:
    return {
        "format": FORMAT,
        "step": int(step),
        "model": field.state_dict(),
        "grid": grid.state_dict(),
        "optimizer": optimizer.state_dict(),
        "config": json.dumps(config, sort_keys=True, default=str),
    }


def save_snapshot(path: str | os.PathLike, field: torch.nn.Module, grid: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, step: int, config: dict) -> Path:
    return atomic_torch_save(snapshot_state(field, grid, optimizer, step, config), path)


def read_snapshot(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load and validate a snapshot file (no arbitrary unpickling)."""
    path = Path(path)
    if not path.is_file():
        raise SnapshotError(f"{path}: no such snapshot")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or unsafe files
        raise SnapshotError(f"{path}: not a readable hvd_ngp snapshot ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise SnapshotError(f"{path}: not an hvd_ngp snapshot (format {state.get('format') if isinstance(state, dict) else '?'})")
    return state


def restore_snapshot(state: dict, field: torch.nn.Module, grid: torch.nn.Module,
                     optimizer: torch.optim.Optimizer | None, source: str = "snapshot") -> int:
    """Load ``state`` into the objects; returns the step it was taken at."""
    try:
        field.load_state_dict(state["model"])
        grid.load_state_dict(state["grid"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, KeyError, ValueError) as exc:
        raise SnapshotError(f"{source}: does not match this model/config: {str(exc).splitlines()[0]}") from None
    return int(state["step"])


def snapshot_config(state: dict) -> dict:
    return json.loads(state["config"])
