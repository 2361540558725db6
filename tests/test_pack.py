"""``hvd-ngp-data pack``: decoded uint8 shards that the loader memory-maps, read transparently by the trainer."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_cpu_args

from hvd_ngp.cluster import dist
from hvd_ngp.config import parse_args
from hvd_ngp.data import load_scene, scene_format
from hvd_ngp.data.builtin import ensure_builtin
from hvd_ngp.errors import SceneError
from hvd_ngp.tools.data_info import main as data_main
from hvd_ngp.training.trainer import Trainer


@pytest.fixture
def packed(scene_cache, tmp_path):
    out = tmp_path / "packed"
    assert data_main(["pack", "builtin", "--scene_cache", str(scene_cache), "--out", str(out), "--shards", "3"]) == 0
    return out


def test_packed_scene_loads_the_same_frames(scene_cache, packed):
    source = load_scene(ensure_builtin(scene_cache, 0))
    assert scene_format(packed) == "packed"
    assert sorted(p.name for p in packed.glob("*.u8")) == [
        f"{s}_{k:03d}.u8" for s in ("test", "train") for k in range(3)
    ]
    for lazy in (False, True):
        scene = load_scene(packed, lazy_train=lazy)
        for a, b in ((source.train, scene.train), (source.test, scene.test)):
            assert len(a) == len(b) and a.names == b.names
            for name in ("c2w", "intrinsics", "distortion", "sizes", "fisheye"):
                assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(scene.test.images, source.test.images)
        if lazy:
            assert scene.train.images is None
            assert all(
                torch.equal(torch.from_numpy(scene.train.files.read(i)), source.train.images[i])
                for i in range(len(source.train))
            )
        else:
            assert torch.equal(scene.train.images, source.train.images)
        assert scene.summary() | {"source": ""} == source.summary() | {"source": ""}


def test_reading_a_frame_maps_only_its_shard(packed):
    files = load_scene(packed, lazy_train=True).train.files
    n = len(files.frames)
    last = files.subset([n - 1])
    last.read(0)
    assert set(last._maps) == {2}  # the last third of the frames lives in train_002.u8 alone


def test_bad_packed_scenes_name_the_file(packed):
    with pytest.raises(SceneError, match=r"packed.json: packed with --holdout_every 0, asked for 8"):
        load_scene(packed, holdout_every=8)
    with pytest.raises(SceneError, match=r"packed.json: packed at --downscale 1, asked for 2"):
        load_scene(packed, downscale=2)
    shard = packed / "train_002.u8"
    shard.write_bytes(shard.read_bytes()[:100])
    scene = load_scene(packed, lazy_train=True)
    with pytest.raises(SceneError, match=r"train_002.u8: truncated"):
        scene.train.files.read(len(scene.train) - 1)
    meta = json.loads((packed / "packed.json").read_text())
    sizes = meta["splits"]["train"]["sizes"]
    sizes[0] = [*sizes[0], 4]  # a size is (width, height)
    (packed / "packed.json").write_text(json.dumps(meta))
    with pytest.raises(SceneError, match=r"packed.json: malformed split \(ValueError"):
        load_scene(packed)
    sizes[0] = sizes[0][:2]
    meta["format"] = "other"
    (packed / "packed.json").write_text(json.dumps(meta))
    with pytest.raises(SceneError, match=r"packed.json: 'format' is 'other'"):
        load_scene(packed)


def test_the_trainer_draws_the_same_rays_from_a_packed_scene(scene_cache, packed, tmp_path):
    """The trainer's data pipeline over the shards: the same seed draws the same rays with the same colours."""
    batches = []
    for scene in ("builtin", str(packed)):
        dist.shutdown()
        tr = Trainer.build(parse_args(tiny_cpu_args(scene_cache, tmp_path / scene[-6:], "--scene", scene)))
        batches.append(tr.data.sampler.sample(512))
        tr.data.sampler.close()
    dist.shutdown()
    a, b = batches
    assert torch.equal(a.rgba, b.rgba) and torch.equal(a.origins, b.origins) and torch.equal(a.directions, b.directions)
    assert float(a.rgba[:, :3].std()) > 0.05  # real pixels, not an empty store
