"""Checkpoints: round trip, atomic writes, digests, retention, resume that continues the same trajectory."""

from __future__ import annotations

import json
import os
import pickle
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_ARGS, tensor_digest as digest, tiny_cpu_args

from hvd_ngp.cluster import dist
from hvd_ngp.config import CPU_CONFIG, parse_args
from hvd_ngp.data.scene import Frames
from hvd_ngp.errors import ConfigError, HvdNgpError, SnapshotError
from hvd_ngp.model.field import NGPField
from hvd_ngp.render.occupancy import OccupancyGrid
from hvd_ngp.state.checkpoint import (
    FORMAT_V1,
    CheckpointManager,
    atomic_torch_save,
    capture,
    read_snapshot,
    restore,
    state_digest,
)
from hvd_ngp.state.trainstate import TrainState, make_rank_streams
from hvd_ngp.training.recipe import make_optimizer
from hvd_ngp.training.trainer import run

AABB = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
FRAMES = Frames(
    torch.zeros(2, 4, 4, 4, dtype=torch.uint8),
    torch.eye(4)[:3].expand(2, 3, 4).clone(),
    torch.tensor([[4.0, 4.0, 2.0, 2.0]] * 2),
    torch.zeros(2, 6),
)


@pytest.fixture(autouse=True)
def size_one_runtime():
    dist.init("cpu")
    yield
    dist.shutdown()


def build(seed: int) -> TrainState:
    torch.manual_seed(seed)
    args = parse_args(["--config", str(CPU_CONFIG), *TINY_ARGS])
    field = NGPField(args.model, AABB)
    opt, _ = make_optimizer(field, args.model["optimizer"], "test")
    return TrainState(
        field,
        OccupancyGrid(AABB, 8),
        opt,
        None,
        *make_rank_streams(FRAMES, seed, 0, 1, torch.device("cpu")),
        SimpleNamespace(n_rays=128),
    )


def advance(ts: TrainState) -> None:
    """One optimizer step, a grid update and some draws from every generator."""
    x = torch.rand(64, 3)
    ts.field(x, torch.nn.functional.normalize(torch.randn(64, 3), dim=-1))[0].sum().backward()
    ts.optimizer.step()
    ts.grid.density.uniform_()
    ts.grid.refresh_occupied()
    ts.sampler.sample(32)
    torch.rand(5, generator=ts.bg_gen)
    ts.step, ts.n_rays = ts.step + 1, 192


def tensors(ts: TrainState) -> list[torch.Tensor]:
    opt = [t for s in ts.optimizer.state_dict()["state"].values() for t in s.values()]
    return [*ts.field.state_dict().values(), ts.grid.density, ts.grid.occupied, *opt]


def test_round_trip_restores_everything_including_rank_streams(tmp_path):
    ts = build(0)
    advance(ts)
    path = atomic_torch_save(capture(ts, {"note": "x"}), tmp_path / "s.pt")
    other = build(1)
    note = restore(other, read_snapshot(path), str(path), reseed=lambda: pytest.fail("same world: no reseed"))
    assert note == "" and other.step == 1 and other.n_rays == 192
    assert all(torch.equal(a, b) for a, b in zip(tensors(ts), tensors(other)))
    # the random streams continue where they were: the next draws are the same
    assert torch.equal(ts.sampler.sample(16).pixel, other.sampler.sample(16).pixel)
    assert torch.equal(torch.rand(4, generator=ts.bg_gen), torch.rand(4, generator=other.bg_gen))


def test_global_torch_stream_is_restored(tmp_path):
    ts = build(0)
    snap = capture(ts, {})
    expected = torch.rand(4)
    torch.manual_seed(999)
    restore(build(0), snap, "s", reseed=lambda: None)
    assert torch.equal(torch.rand(4), expected)


class Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickled_objects_are_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT_V1, "payload": Boom()}, path, pickle_module=pickle)
    with pytest.raises(SnapshotError, match="not a readable hvd_ngp snapshot"):
        read_snapshot(path)


def test_damaged_contents_fail_the_digest(tmp_path):
    ts = build(0)
    snap = capture(ts, {})
    snap["model"] = {k: v.clone() for k, v in snap["model"].items()}
    next(iter(snap["model"].values())).view(-1)[0] += 1.0  # a flipped value the zip container cannot see
    torch.save(snap, tmp_path / "s.pt")
    with pytest.raises(SnapshotError, match="do not match their digest"):
        read_snapshot(tmp_path / "s.pt")
    # the digest follows the contents: an identical copy keeps it, one changed value or the step changes it
    intact = capture(ts, {})
    copy = {**intact, "model": {k: v.clone() for k, v in intact["model"].items()}}
    assert state_digest(copy) == intact["digest"]
    next(iter(copy["model"].values())).view(-1)[-1] -= 1.0
    assert state_digest(copy) != intact["digest"]
    assert state_digest({**intact, "step": intact["step"] + 1}) != intact["digest"]


def test_failed_write_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "s.pt"
    atomic_torch_save({"v": torch.ones(3)}, path)

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(SnapshotError, match="No space left on device"):
        atomic_torch_save({"v": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["v"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]  # no temporary left behind


def test_disk_full_in_the_middle_of_a_write_leaves_the_previous_file(tmp_path, monkeypatch):
    """ENOSPC after 1 KiB of the second write (HVD_NGP_FAULTS, the hook the multi-rank tests use too)."""
    monkeypatch.setattr("hvd_ngp.testing.faults._saves", 0)
    monkeypatch.setenv("HVD_NGP_FAULTS", "save_enospc@0:2")
    path = tmp_path / "s.pt"
    atomic_torch_save({"v": torch.ones(4096)}, path)
    with pytest.raises(SnapshotError, match="No space left on device.*previous file there is unchanged"):
        atomic_torch_save({"v": torch.zeros(4096)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["v"], torch.ones(4096))
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]


def test_written_files_follow_the_umask(tmp_path):
    path = atomic_torch_save({"v": torch.ones(1)}, tmp_path / "s.pt")
    mask = os.umask(0o022)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_mismatched_snapshot_is_a_clear_error(tmp_path):
    snap = capture(build(0), {})
    args = parse_args(["--config", str(CPU_CONFIG)])  # a bigger model
    big = build(0)
    big.field = NGPField(args.model, AABB)
    with pytest.raises(HvdNgpError, match="s.pt: does not match this model") as err:
        restore(big, snap, "s.pt", reseed=lambda: None)
    assert "size mismatch for encoding." in str(err.value) and "\n" not in str(err.value)  # the tensor, one line


def test_manager_keeps_the_newest_and_resumes_from_the_newest_valid(tmp_path):
    ts = build(0)
    manager = CheckpointManager(tmp_path, every_steps=1, keep=2)
    for _ in range(4):
        advance(ts)
        manager.write(ts, {})
    (tmp_path / ".ckpt-00000009.pt.abc.tmp").write_bytes(b"half a file")  # a writer killed mid-write
    assert [s for s, _ in manager.existing()] == [4, 3]
    manager.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003.pt", "ckpt-00000004.pt"]
    # truncate the newest: it is skipped with a warning, renamed aside, and step 3 is chosen
    newest = tmp_path / "ckpt-00000004.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    warnings = []
    path, snap = manager.newest_valid(warn=warnings.append)
    assert path.name == "ckpt-00000003.pt" and snap["step"] == 3
    assert (
        len(warnings) == 1
        and "ckpt-00000004.pt" in warnings[0]
        and "renamed to ckpt-00000004.pt.invalid" in warnings[0]
    )
    assert (tmp_path / "ckpt-00000004.pt.invalid").is_file()
    assert CheckpointManager(tmp_path / "empty").newest_valid() is None


def final_state(path) -> str:
    snap = read_snapshot(path)
    opt = [t for s in snap["optimizer"]["state"].values() for t in s.values()]
    ema = snap["ema"]
    assert ema["count"] > 0  # base.json's Ema block: the average is saved and resumed too
    return digest(
        [
            *snap["model"].values(),
            *snap["grid"].values(),
            *opt,
            snap["rank_streams"],
            *ema["average"].values(),
            torch.tensor(ema["count"]),
        ]
    )


def test_resume_continues_the_same_trajectory_bitwise(tmp_path, scene_cache):
    """2N steps straight == N steps, stop, resume N steps (parameters, Adam state, grid, streams)."""
    dist.shutdown()
    common = [
        "--config",
        str(CPU_CONFIG),
        *TINY_ARGS,
        "--scene_cache",
        str(scene_cache),
        "--device",
        "cpu",
        "--log_every",
        "6",
        "--save_renders",
        "0",
        "--n_eval_views",
        "1",
    ]
    straight = run(
        parse_args(
            [
                *common,
                "--n_steps",
                "24",
                "--out_dir",
                str(tmp_path / "a"),
                "--save_snapshot",
                str(tmp_path / "straight.pt"),
            ]
        )
    )
    dist.shutdown()
    first = run(parse_args([*common, "--n_steps", "12", "--out_dir", str(tmp_path / "b"), "--ckpt_every", "12"]))
    dist.shutdown()
    second = run(
        parse_args(
            [
                *common,
                "--n_steps",
                "24",
                "--out_dir",
                str(tmp_path / "b"),
                "--ckpt_every",
                "12",
                "--resume",
                "auto",
                "--save_snapshot",
                str(tmp_path / "resumed.pt"),
            ]
        )
    )
    assert (first.step, second.step, straight.step) == (12, 24, 24)
    assert [h["step"] for h in second.metrics["history"]] == [6, 12, 18, 24]  # continued, not restarted
    assert final_state(tmp_path / "straight.pt") == final_state(tmp_path / "resumed.pt")
    for (name, a), b in zip(straight.field.named_parameters(), second.field.parameters()):
        assert torch.equal(a, b), name


def test_v1_snapshot_still_loads_with_fresh_streams(tmp_path, scene_cache):
    dist.shutdown()
    common = tiny_cpu_args(
        scene_cache, tmp_path / "o", "--log_every", "4", "--save_renders", "0", "--n_eval_views", "1"
    )
    run(parse_args([*common, "--n_steps", "4", "--save_snapshot", str(tmp_path / "v2.pt")]))
    dist.shutdown()
    v2 = read_snapshot(tmp_path / "v2.pt")
    v1 = {
        "format": FORMAT_V1,
        "step": v2["step"],
        "model": v2["model"],
        "grid": v2["grid"],
        "optimizer": v2["optimizer"],
        "config": json.dumps({}),
    }
    torch.save(v1, tmp_path / "v1.pt")
    result = run(parse_args([*common, "--n_steps", "6", "--load_snapshot", str(tmp_path / "v1.pt")]))
    # resumed at step 4: one log interval (steps 5-6); from step 0 it would log steps 4 and 6
    assert v2["step"] == 4 and result.step == 6
    assert [h["step"] for h in result.metrics["history"]] == [6]


def test_snapshot_without_an_average_loads_and_restarts_it(tmp_path, scene_cache):
    dist.shutdown()
    common = tiny_cpu_args(
        scene_cache, tmp_path / "o", "--log_every", "4", "--save_renders", "0", "--n_eval_views", "1"
    )
    run(parse_args([*common, "--n_steps", "4", "--save_snapshot", str(tmp_path / "new.pt")]))
    dist.shutdown()
    snap = read_snapshot(tmp_path / "new.pt")
    del snap["ema"]  # as written before the Ema block existed
    snap["digest"] = state_digest(snap)
    torch.save(snap, tmp_path / "old.pt")
    result = run(
        parse_args(
            [
                *common,
                "--n_steps",
                "6",
                "--load_snapshot",
                str(tmp_path / "old.pt"),
                "--save_snapshot",
                str(tmp_path / "after.pt"),
            ]
        )
    )
    assert result.step == 6 and read_snapshot(tmp_path / "after.pt")["ema"]["count"] == 2


def test_resume_and_load_snapshot_are_exclusive():
    with pytest.raises(ConfigError, match="--resume or --load_snapshot"):
        parse_args(["--resume", "auto", "--load_snapshot", "x.pt"])


def test_resume_from_a_folder_without_checkpoints_is_an_error(tmp_path, scene_cache):
    dist.shutdown()
    with pytest.raises(HvdNgpError, match="no valid checkpoint"):
        run(
            parse_args(
                [
                    "--config",
                    str(CPU_CONFIG),
                    *TINY_ARGS,
                    "--scene_cache",
                    str(scene_cache),
                    "--device",
                    "cpu",
                    "--out_dir",
                    str(tmp_path / "o"),
                    "--resume",
                    str(tmp_path),
                ]
            )
        )
