"""Checkpoints: the whole training state in one file, written atomically by rank 0, resumed exactly.

A checkpoint (format ``hvd_ngp.snapshot.v2``) holds the step, model, occupancy grid, optimizer,
fp16 gradient scaler, parameter average (``ema``; empty without an ``Ema`` block, absent in older
files), the gradient-sync state (``grad_sync``: ``--grad_sync delayed``'s average in flight, waited for
first; ``periodic`` averages the ranks' models first, a checkpoint is a sync point), run progress, and every rank's random streams and ray count (gathered to
rank 0 as a ``[world_size, L]`` byte tensor; on resume each rank gets its own row back). So a
resumed run on the same number of ranks continues the same trajectory, bit for bit on CPU.

Files are written by rank 0 only, atomically (temporary file in the same folder, fsync, rename,
fsync of the folder), so a crash, a kill or a full disk leaves the previous file intact. They are
read with ``torch.load(weights_only=True)``, which refuses arbitrary pickled objects (the file
holds only tensors, numbers, strings and containers of them; JSON strings for the rest), and a
SHA-256 digest over the contents catches files damaged after they were written.

Model parallel (``--model_parallel K``): the file ``ckpt-<step>.pt`` is the manifest. It holds the
shared state and region 0's model, optimizer and average, the layout (K and the partition) and
the name and digest of each other region's file ``ckpt-<step>.region<k>.pt`` (format
``hvd_ngp.region.v1``), which that region's leader (replica 0) writes atomically before rank 0
writes the manifest, so a manifest never names a region file that is not complete. A resume needs
the same K and partition; each region's leader reads its own file and the region group gets it
by broadcast.

``CheckpointManager`` names files ``ckpt-<step>.pt`` in one folder, keeps the newest K, and finds
the newest *valid* one for ``--resume auto`` (invalid ones are skipped with a warning and renamed
``*.invalid`` so they never shadow a good one again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, cast

import torch

from .. import faultpoints
from ..cluster import dist
from ..errors import SnapshotError, os_cause
from .trainstate import TrainState

FORMAT_V1 = "hvd_ngp.snapshot.v1"  # model, grid, optimizer, step, config (read for compatibility)
FORMAT = "hvd_ngp.snapshot.v2"
REGION_FORMAT = "hvd_ngp.region.v1"


def region_path(path: str | os.PathLike, region: int) -> Path:
    """``ckpt-00000010.pt`` -> ``ckpt-00000010.region<region>.pt`` (beside the manifest)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.region{region}{path.suffix}")


# ------------------------------------------------------------------------------------ files


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to ``path`` so that a crash leaves either the old file or the new one, never half."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot write: {os_cause(exc)}") from None
    stream = None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide checkpoints from the user's group
        with os.fdopen(fd, "wb") as f:
            stream = _ErrorRecorder(faultpoints.checkpoint_stream(f, tmp))
            torch.save(obj, cast(IO[bytes], stream))  # a duck-typed writer: write and flush
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except (OSError, RuntimeError) as exc:  # torch's writer reports a failed write as RuntimeError
        try:
            os.unlink(tmp)
        except OSError:
            pass
        cause: BaseException = exc
        if stream is not None and stream.error is not None:  # torch reports it as "unexpected pos ..."
            cause = stream.error
        reason = os_cause(cause) if isinstance(cause, OSError) and cause.errno else str(cause).splitlines()[0]
        raise SnapshotError(f"{path}: writing failed ({reason}); any previous file there is unchanged") from None
    return path


class _ErrorRecorder:
    """A pass-through binary writer that remembers the ``OSError`` (e.g. ENOSPC) a write raised."""

    def __init__(self, f) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._f.flush()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def state_digest(state: dict) -> str:
    """SHA-256 over every key, scalar and tensor byte of ``state`` (its ``digest`` entry excluded)."""
    h = hashlib.sha256()

    def visit(obj: Any) -> None:
        if isinstance(obj, dict):
            for key in sorted(obj, key=str):
                if key != "digest":
                    h.update(f"<{key}>".encode())
                    visit(obj[key])
        elif isinstance(obj, (list, tuple)):
            h.update(f"[{len(obj)}".encode())
            for item in obj:
                visit(item)
        elif isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous()
            h.update(f"{t.dtype}{list(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(obj).encode())

    visit(state)
    return h.hexdigest()


def read_snapshot(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load and validate a snapshot/checkpoint file (no arbitrary unpickling; digest checked)."""
    path = Path(path)
    if not path.is_file():
        raise SnapshotError(f"{path}: no such snapshot")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt, truncated or unsafe files
        raise SnapshotError(
            f"{path}: not a readable hvd_ngp snapshot ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, FORMAT_V1):
        raise SnapshotError(
            f"{path}: not an hvd_ngp snapshot (format {state.get('format') if isinstance(state, dict) else '?'})"
        )
    if state["format"] == FORMAT and state.get("digest") != state_digest(state):
        raise SnapshotError(f"{path}: contents do not match their digest (the file was damaged after it was written)")
    return state


def snapshot_config(state: dict) -> dict:
    return json.loads(state["config"])


# ------------------------------------------------------------------------------------ state <-> snapshot


def load_average(field: torch.nn.Module, state: dict) -> bool:
    """Put a checkpoint's averaged weights (``training.optim.ParameterEma.state_dict``) into ``field``'s parameters
    (the render tool); False when it holds none."""
    if not state or not int(state.get("count", 0)):
        return False
    with torch.no_grad():
        for name, p in field.named_parameters():
            p.copy_(state["average"][name])
    return True


def capture(ts: TrainState, config: dict, regions: list[dict] | None = None) -> dict | None:
    """The snapshot of ``ts`` on rank 0 (``None`` elsewhere). Collective: gathers every rank's streams.
    ``regions``: model parallel, the other regions' files (name, digest) the manifest lists."""
    rt = dist.runtime()
    if ts.exchange is not None:  # --grad_sync: the delayed average lands, or the ranks' models are averaged
        ts.exchange.settle()
    streams = dist.allgather(ts.pack_streams()[None], name="checkpoint.streams")  # [size, L]
    if not rt.is_root:
        return None
    snap = {
        "format": FORMAT,
        "step": int(ts.step),
        # --delay_compensation local: the parameters every rank shares (theta), not this rank's speculative ones
        "model": {**ts.field.state_dict(), **(ts.exchange.anchor_state() if ts.exchange is not None else {})},
        "grid": ts.grid.state_dict(),
        "optimizer": ts.optimizer.state_dict(),
        "scaler": ts.scaler.state_dict() if ts.scaler is not None else {},
        "ema": ts.ema.state_dict() if ts.ema is not None else {},
        "grad_sync": ts.exchange.state_dict() if ts.exchange is not None else {},
        "world_size": rt.size,
        "rank_streams": streams,
        "rank_layout": json.dumps(ts.stream_layout()),
        "progress": json.dumps(ts.progress),
        "config": json.dumps(config, sort_keys=True, default=str),
    }
    if ts.layout is not None:
        snap["model_parallel"] = json.dumps({**json.loads(ts.layout), "regions": regions or []})
    snap["digest"] = state_digest(snap)
    return snap


def region_snapshot(ts: TrainState, region: int) -> dict:
    """One region's part of a model-parallel checkpoint (its leader's model, optimizer, average)."""
    snap = {
        "format": REGION_FORMAT,
        "step": int(ts.step),
        "region": int(region),
        "model": ts.field.state_dict(),
        "optimizer": ts.optimizer.state_dict(),
        "ema": ts.ema.state_dict() if ts.ema is not None else {},
    }
    snap["digest"] = state_digest(snap)
    return snap


def save(ts: TrainState, path: str | os.PathLike, config: dict) -> Path:
    """Collective: gather, then rank 0 writes ``path`` atomically; a failed write is an error on every rank.
    Model parallel: the region files first (each by its region's leader), then the manifest."""
    regions = None
    groups = dist.groups()
    if groups.enabled:

        def write_region() -> str | None:
            if groups.replica != 0 or groups.region == 0:
                return None
            snap = region_snapshot(ts, groups.region)
            atomic_torch_save(snap, region_path(path, groups.region))
            return snap["digest"]

        digests = dist.allgather_object(
            dist.agree(write_region, "writing a region checkpoint"), name="checkpoint.regions"
        )
        regions = [
            {"region": k, "file": region_path(path, k).name, "digest": digests[k]}
            for k in range(1, groups.model_parallel)
        ]
    snap = capture(ts, config, regions)
    dist.agree(lambda: atomic_torch_save(snap, path) if snap is not None else None, "writing a checkpoint")
    return Path(path)


def snapshot_layout(state: dict) -> dict | None:
    """A model-parallel snapshot's layout {"model_parallel", "partition", "regions"}; None for K = 1."""
    return json.loads(state["model_parallel"]) if "model_parallel" in state else None


def read_region(
    manifest: str | os.PathLike, layout: dict, region: int, map_location: str | torch.device = "cpu"
) -> dict:
    """Region ``region``'s state of a model-parallel snapshot (region 0: the manifest's own), digest checked
    against the manifest's record."""
    if region == 0:
        state = read_snapshot(manifest, map_location)
        return {"model": state["model"], "optimizer": state["optimizer"], "ema": state.get("ema") or {}}
    entry = next((e for e in layout["regions"] if e["region"] == region), None)
    path = Path(manifest).with_name(entry["file"]) if entry is not None else region_path(manifest, region)
    if entry is None or not path.is_file():
        raise SnapshotError(f"{path}: region {region}'s file of the model-parallel snapshot {manifest} is missing")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise SnapshotError(
            f"{path}: not a readable hvd_ngp region file ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != REGION_FORMAT or state.get("region") != region:
        raise SnapshotError(f"{path}: not region {region} of an hvd_ngp model-parallel snapshot")
    if state.get("digest") != state_digest(state) or state["digest"] != entry["digest"]:
        raise SnapshotError(f"{path}: contents do not match the digest its manifest {Path(manifest).name} records")
    return state


def restore_snapshot(
    state: dict,
    field: torch.nn.Module,
    grid: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    source: str = "snapshot",
    averaged: bool = False,
) -> int:
    """Load a snapshot's model, grid (and optimizer) into the objects, locally; returns its step.

    For tools that need the trained field only (the render tool: ``averaged`` puts the averaged
    weights in the field when the snapshot holds them); training resumes with ``resume``.
    """
    try:
        field.load_state_dict(state["model"])
        grid.load_state_dict(state["grid"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        if averaged:
            load_average(field, state.get("ema") or {})
    except (RuntimeError, KeyError, ValueError) as exc:
        raise SnapshotError(f"{source}: does not match this model/config: {first_problem(exc)}") from None
    return int(state["step"])


def first_problem(exc: BaseException) -> str:
    """torch's state-dict error in one line: its heading and the first tensor it names (``size mismatch
    for encoding.params: ...``), not the whole list."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(exc).__name__


def _load_shared(ts: TrainState, snap: dict, source: str) -> None:
    """Rank 0: put ``snap``'s model, grid, optimizer and scaler into ``ts``."""
    restore_snapshot(snap, ts.field, ts.grid, ts.optimizer, source)
    if ts.scaler is not None and snap.get("scaler"):
        ts.scaler.load_state_dict(snap["scaler"])
    if ts.ema is not None:
        ts.ema.load_state_dict(snap.get("ema") or {})


def _load_region(ts: TrainState, state: dict, source: str) -> None:
    """A region leader: its region's model, optimizer and average into ``ts``."""
    try:
        ts.field.load_state_dict(state["model"])
        ts.optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, KeyError, ValueError) as exc:
        raise SnapshotError(f"{source}: does not match this model/config: {first_problem(exc)}") from None
    if ts.ema is not None:
        ts.ema.load_state_dict(state.get("ema") or {})


def restore(ts: TrainState, snap: dict | None, source: str, reseed: Callable[[], None]) -> str:
    """Collective: rank 0 holds ``snap`` (the others ``None``); afterwards every rank holds the state.

    Shared state is loaded on rank 0 and broadcast (model, optimizer state, grid, scaler, step,
    progress); each rank gets its own random streams and ray count back when the checkpoint was
    taken on the same number of ranks (and device type). Otherwise ``reseed()`` gives every rank
    fresh streams for its new shard, and the returned note says so (the trajectory then differs).
    """
    rt = dist.runtime()
    groups = dist.groups()

    def held() -> dict:
        """The snapshot: rank 0's code only."""
        assert snap is not None, "restore: rank 0 holds the snapshot"
        return snap

    layout = dist.broadcast_object(snapshot_layout(held()) if rt.is_root else None, name="checkpoint.layout")
    want = json.loads(ts.layout) if ts.layout is not None else None
    same_layout = (layout is None and want is None) or (
        layout is not None
        and want is not None
        and layout["model_parallel"] == want["model_parallel"]
        and layout["partition"] == want["partition"]
    )
    if not same_layout:
        taken = f"--model_parallel {layout['model_parallel']}" if layout else "--model_parallel 1"
        raise SnapshotError(
            f"{source}: taken with {taken} and this run has --model_parallel {groups.model_parallel}"
            + (
                " (another partition of the scene)"
                if layout and want and layout["model_parallel"] == want["model_parallel"]
                else ""
            )
            + ": resume with the same --model_parallel and scene"
        )
    dist.agree(lambda: _load_shared(ts, held(), source) if rt.is_root else None, "loading the checkpoint")
    if groups.enabled:

        def load_region() -> None:
            if groups.replica == 0 and groups.region > 0:
                assert layout is not None  # groups.enabled: same_layout holds a model-parallel layout
                _load_region(ts, read_region(source, layout, groups.region), source)

        dist.agree(load_region, "loading the region checkpoints")
    root_meta: dict[str, Any] | None = None
    if rt.is_root:
        snap = held()
        root_meta = {
            "step": int(snap["step"]),
            "world_size": int(snap.get("world_size", 0)),
            "layout": json.loads(snap.get("rank_layout", "[]")),
            "scaler": snap.get("scaler") or {},
            "progress": json.loads(snap["progress"]) if "progress" in snap else None,
            "ema_count": ts.ema.count if ts.ema is not None else 0,
        }
    meta = dist.broadcast_object(root_meta, name="checkpoint.meta")
    assert meta is not None  # rank 0 sent it
    ts.step = meta["step"]
    if meta["progress"] is not None:
        ts.progress = meta["progress"]
    if ts.scaler is not None and meta["scaler"] and not rt.is_root:
        ts.scaler.load_state_dict(meta["scaler"])
    dist.broadcast_(ts.grid.density, name="checkpoint.grid")
    if ts.ema is not None:
        ts.ema.count = meta["ema_count"]
        for name, avg in ts.ema.tensors().items():
            if groups.enabled:
                dist.group_broadcast_(avg, "region", name=f"checkpoint.{name}")
            else:
                dist.broadcast_(avg, name=f"checkpoint.{name}")
    ts.grid.refresh_occupied()
    if groups.enabled:
        dist.broadcast_region_state(ts.field, ts.optimizer)
    else:
        dist.broadcast_state(ts.field, ts.optimizer)  # optimizer state first, then parameters (see dist)
    sync_note = ts.exchange.restore(held().get("grad_sync") if rt.is_root else None) if ts.exchange is not None else ""
    if rt.is_root and ts.exchange is None and int((held().get("grad_sync") or {}).get("pending", -1)) >= 0:
        sync_note = "taken with --grad_sync delayed: its last average, not yet applied, is dropped"

    same_world = meta["world_size"] == rt.size and [list(x) for x in meta["layout"]] == ts.stream_layout()
    if sync_note:
        dist.log(f"resume: {sync_note}")
    if not same_world:
        reseed()
        if meta["world_size"] == 0:
            return "it holds no per-rank random streams (format v1): every rank starts fresh streams"
        where = (
            f"on {meta['world_size']} rank(s) and this run has {rt.size}"
            if meta["world_size"] != rt.size
            else "on another device type"
        )
        return (
            f"it was taken {where}: every rank starts fresh streams for its shard, so the trajectory "
            "differs from an uninterrupted run"
        )
    n = sum(n for _, n in meta["layout"])
    streams = held()["rank_streams"].to("cpu") if rt.is_root else torch.zeros(rt.size, n, dtype=torch.uint8)
    dist.broadcast_(streams, name="checkpoint.streams")  # a scatter: each rank keeps its own row
    ts.unpack_streams(streams[rt.rank], meta["layout"])
    return ""


# ------------------------------------------------------------------------------------ folder of checkpoints

_NAME = re.compile(r"^ckpt-(\d+)\.pt$")
_TEMP = re.compile(r"^\.ckpt-\d+(\.region\d+)?\.pt\..*\.tmp$")
_REGION = re.compile(r"^ckpt-(\d+)\.region\d+\.pt$")


class CheckpointManager:
    """``ckpt-<step>.pt`` files in ``directory``: when to write, which to keep, which to resume from.

    Only rank 0 touches the folder. ``every_steps`` is decided locally (the same on every rank); a
    cadence in minutes must be agreed, so the trainer reads it from its shared training clock.
    """

    def __init__(self, directory: str | os.PathLike, every_steps: int = 0, keep: int = 3) -> None:
        if every_steps < 0 or keep < 1:
            raise ValueError(f"checkpoint cadence must be >= 0 and keep >= 1, got {every_steps}, {keep}")
        self.directory = Path(directory)
        self.every_steps, self.keep = every_steps, keep

    def path(self, step: int) -> Path:
        return self.directory / f"ckpt-{step:08d}.pt"

    def existing(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every checkpoint file in the folder, newest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := _NAME.match(p.name)) and p.is_file()]
        return sorted(found, reverse=True)

    def due_by_steps(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def newest_valid(
        self, map_location: str | torch.device = "cpu", warn: Callable[[str], None] = print
    ) -> tuple[Path, dict] | None:
        """The newest checkpoint that loads and passes its digest; invalid newer ones are renamed ``*.invalid``."""
        for _, path in self.existing():
            try:
                return path, read_snapshot(path, map_location)
            except SnapshotError as exc:
                aside = path.with_name(path.name + ".invalid")
                try:
                    path.rename(aside)
                    moved = f"; renamed to {aside.name}"
                except OSError:
                    moved = ""
                warn(f"warning: skipping checkpoint {exc}{moved}")
        return None

    def write(self, ts: TrainState, config: dict) -> Path:
        """Collective: save ``ckpt-<step>.pt``, then (rank 0) drop all but the newest ``keep`` and stale temporaries."""
        path = save(ts, self.path(ts.step), config)
        if dist.runtime().is_root:
            self.prune()
        return path

    def prune(self) -> None:
        for _, old in self.existing()[self.keep :]:
            old.unlink(missing_ok=True)
        kept = {step for step, _ in self.existing()}
        newest = max(kept, default=-1)
        for p in self.directory.iterdir():  # region files of pruned manifests (a newer one may be mid-write)
            if (m := _REGION.match(p.name)) and int(m.group(1)) not in kept and int(m.group(1)) < newest:
                p.unlink(missing_ok=True)
        for p in self.directory.iterdir():  # left by a writer that was killed mid-write
            if _TEMP.match(p.name):
                p.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------ resume

#: the model blocks a checkpoint's training depends on (``trained_on``); the optimizer and the distributed
#: block may change on a resume (a new learning rate, other ranks)
TRAINED_ON_BLOCKS = ("encoding", "network", "dir_encoding", "rgb_network", "loss", "marching")


def trained_on(model: dict, scene_digest: str) -> dict:
    """What a checkpoint records it was trained on: the scene's digest and the model, loss and marching blocks."""
    return {"scene": scene_digest, **{block: model.get(block) for block in TRAINED_ON_BLOCKS}}


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(_flat(value[key], f"{prefix}.{key}"))
        return out or {prefix: {}}
    return {prefix: value}


def trained_on_differences(recorded: dict, now: dict) -> list[str]:
    """``"marching.grid_resolution: 16 in the checkpoint, 32 now"`` for each setting that differs; settings the
    checkpoint does not record (an older file) are not compared."""
    found = []
    for key in now:
        if key not in recorded:
            continue
        if key == "scene":
            if recorded[key] != now[key]:
                found.append(
                    f"scene: digest {recorded[key]} in the checkpoint, {now[key]} now (another scene, split "
                    f"or --downscale)"
                )
            continue
        before, after = _flat(recorded[key], key), _flat(now[key], key)
        for name in sorted(set(before) | set(after)):
            if json.dumps(before.get(name), sort_keys=True) != json.dumps(after.get(name), sort_keys=True):
                found.append(
                    f"{name}: {json.dumps(before.get(name, '<unset>'))} in the checkpoint, "
                    f"{json.dumps(after.get(name, '<unset>'))} now"
                )
    return found


def check_trained_on(path: Path, snap: dict, expect: dict | None, allow_changes: bool) -> str:
    """Rank 0: refuse (``SnapshotError`` naming each difference) a checkpoint trained on another scene or model,
    unless ``allow_changes``; returns a note for the log ("" when nothing differs or nothing is recorded)."""
    if expect is None:
        return ""
    recorded = snapshot_config(snap).get("trained_on") if "config" in snap else None
    if not recorded:
        return "it records no scene digest or model settings (an older checkpoint): not compared"
    diff = trained_on_differences(recorded, expect)
    if diff and not allow_changes:
        raise SnapshotError(
            f"{path}: was trained on something else than this run: "
            + "; ".join(diff)
            + ". Resume with the same scene and model, give another --ckpt_dir (or --out_dir), or "
            "pass --allow_resume_changes if the change is intended"
        )
    return ("resumed despite --allow_resume_changes: " + "; ".join(diff)) if diff else ""


def _pick(
    spec: str | None, manager: CheckpointManager, expect: dict | None = None, allow_changes: bool = False
) -> tuple[Path, dict, str] | None:
    """Rank 0: the checkpoint ``spec`` names ('auto', a file, a folder), read and validated; None: start fresh."""
    if spec is None:
        return None
    if spec == "auto":
        found = manager.newest_valid("cpu", warn=dist.log)
    elif Path(spec).is_dir():
        found = CheckpointManager(spec).newest_valid("cpu", warn=dist.log)
        if found is None:
            raise SnapshotError(f"{spec}: no valid checkpoint (ckpt-<step>.pt) in this folder")
    else:
        found = Path(spec), read_snapshot(spec, "cpu")
    if found is None:
        return None
    return (*found, check_trained_on(found[0], found[1], expect, allow_changes))


def resume(
    ts: TrainState,
    spec: str | None,
    manager: CheckpointManager,
    reseed: Callable[[], None],
    elastic: bool = False,
    expect: dict | None = None,
    allow_changes: bool = False,
) -> None:
    """Start ``ts`` from the checkpoint ``spec`` names, or from scratch (every rank gets rank 0's model).

    Rank 0 decides (and skips invalid newest files with a warning); collective, except in an
    elastic job, where rank 0 loads the shared state alone and the first elastic sync spreads it.
    ``expect``: this run's ``trained_on``; a checkpoint that records another is refused on every rank
    (``check_trained_on``) unless ``allow_changes``.
    """
    rt = dist.runtime()
    if elastic:
        found = _pick(spec, manager, expect, allow_changes) if rt.is_root else None
        if found is not None:
            _load_shared(ts, found[1], str(found[0]))
            ts.step = int(found[1]["step"])
            ts.progress = json.loads(found[1].get("progress", json.dumps(ts.progress)))
            dist.log(f"resumed from {found[0]} at step {ts.step} (elastic: per-rank streams start fresh)")
        return
    found = dist.agree(
        lambda: _pick(spec, manager, expect, allow_changes) if rt.is_root else None,
        "finding the checkpoint to resume from",
    )
    name = dist.broadcast_object(str(found[0]) if found is not None else None, name="checkpoint.resume")
    if name is None:
        if spec == "auto":
            dist.log(f"resume: no checkpoint in {manager.directory}, starting from step 0")
        if dist.groups().enabled:
            dist.broadcast_region_state(ts.field)  # each region's copies start from its leader's
        else:
            dist.broadcast_state(ts.field)
        return
    note = restore(ts, found[1] if found is not None else None, name, reseed)
    notes = [n for n in (found[2] if found is not None else "", note) if n]
    dist.log(f"resumed from {name} at step {ts.step}" + "".join(f"; note: {n}" for n in notes))
