"""Snapshots: round trip, atomic writes, and refusal of files that would unpickle arbitrary objects."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from hvd_ngp.checkpoint import atomic_torch_save, read_snapshot, restore_snapshot, save_snapshot
from hvd_ngp.config import CPU_CONFIG, parse_args
from hvd_ngp.errors import SnapshotError
from hvd_ngp.field import NGPField
from hvd_ngp.occupancy import OccupancyGrid
from hvd_ngp.train import make_optimizer

from conftest import TINY_ARGS

AABB = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])


def build(seed):
    torch.manual_seed(seed)
    args = parse_args(["--config", str(CPU_CONFIG), *TINY_ARGS])
    field = NGPField(args.model, AABB)
    grid = OccupancyGrid(AABB, 8)
    opt, _ = make_optimizer(field, args.model["optimizer"], "test")
    return field, grid, opt


def test_round_trip_restores_model_grid_optimizer_and_step(tmp_path):
    field, grid, opt = build(0)
    x = torch.rand(64, 3)
    field(x, torch.nn.functional.normalize(torch.randn(64, 3), dim=-1))[0].sum().backward()
    opt.step()
    grid.density.uniform_()
    grid.refresh_occupied()
    path = save_snapshot(tmp_path / "s.pt", field, grid, opt, 17, {"note": "x"})
    other, other_grid, other_opt = build(1)
    step = restore_snapshot(read_snapshot(path), other, other_grid, other_opt)
    assert step == 17
    for a, b in zip(field.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(grid.occupied, other_grid.occupied)
    assert other_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


class Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickled_objects_are_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "hvd_ngp.snapshot.v1", "payload": Boom()}, path, pickle_module=pickle)
    with pytest.raises(SnapshotError, match="not a readable hvd_ngp snapshot"):
        read_snapshot(path)


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


def test_mismatched_snapshot_is_a_clear_error(tmp_path):
    field, grid, opt = build(0)
    path = save_snapshot(tmp_path / "s.pt", field, grid, opt, 1, {})
    args = parse_args(["--config", str(CPU_CONFIG)])  # a bigger model
    big = NGPField(args.model, AABB)
    with pytest.raises(SnapshotError, match="does not match this model"):
        restore_snapshot(read_snapshot(path), big, grid, None, str(path))


def test_training_resumes_from_a_snapshot(tmp_path, scene_cache):
    from hvd_ngp.train import run

    common = ["--config", str(CPU_CONFIG), *TINY_ARGS, "--scene_cache", str(scene_cache), "--device", "cpu",
              "--log_every", "2", "--out_dir", str(tmp_path / "out")]
    first = run(parse_args([*common, "--n_steps", "10", "--save_snapshot", str(tmp_path / "s.pt")]))
    second = run(parse_args([*common, "--n_steps", "14", "--load_snapshot", str(tmp_path / "s.pt")]))
    assert first.step == 10 and second.step == 14
    assert [h["step"] for h in second.metrics["history"]] == [12, 14]  # it continued, not restarted
