"""Scene loading: the built-in scene, transforms.json fields and bad input. (Rank shards: test_sampling.py.)"""

from __future__ import annotations

import hashlib
import json
import math

import cv2
import numpy as np
import pytest
import torch
from conftest import SHARED_DATA

from hvd_ngp.data import load_scene
from hvd_ngp.data.builtin import _StillLife, generate_builtin
from hvd_ngp.data.cameras import nerf_to_ngp
from hvd_ngp.data.sampler import image_rays
from hvd_ngp.errors import SceneError


def digest(folder) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_builtin_scene_is_deterministic_and_seeded(tmp_path):
    small = dict(width=24, height=24, n_train=3, n_test=2, supersample=2)
    a = generate_builtin(tmp_path / "a", seed=7, **small)
    b = generate_builtin(tmp_path / "b", seed=7, **small)
    c = generate_builtin(tmp_path / "c", seed=8, **small)
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)


def test_builtin_scene_has_texture_and_alpha(scene_cache):
    scene = load_scene("builtin", scene_cache=scene_cache)
    assert len(scene.train) == 64 and len(scene.test) == 8 and scene.has_alpha
    img = scene.train.images[0].float() / 255
    alpha = img[..., 3]
    assert 0.1 < float((alpha > 0.5).float().mean()) < 0.9  # an object with background around it
    assert float(((alpha > 0) & (alpha < 1)).float().mean()) > 0.005  # anti-aliased silhouettes
    rgb = img[..., :3][alpha == 1]
    assert float(rgb.std(dim=0).mean()) > 0.1  # colour variation, not a flat blob
    lap = cv2.Laplacian((img[..., :3].numpy() * 255).astype(np.uint8), cv2.CV_64F)
    assert float(np.abs(lap).mean()) > 5.0  # texture detail


def test_loader_rays_hit_what_the_generator_drew(scene_cache):
    """instant-ngp's camera convention: rays from the loaded scene, mapped back to the generator's
    world, hit the analytic objects exactly where the image is opaque."""
    scene = load_scene("builtin", scene_cache=scene_cache)
    meta = json.loads(next(scene_cache.glob("builtin-*/transforms_test.json")).read_text())
    still = _StillLife(np.random.default_rng(meta["generator"]["seed"]))
    o, d = image_rays(scene.test, 0, torch.device("cpu"))
    # ngp -> generator world: undo offset/scale, then the axis cycle (x, y, z) -> (y, z, x)
    o_w = ((o.numpy() - 0.5) / 0.33)[:, [2, 0, 1]]
    d_w = d.numpy()[:, [2, 0, 1]]
    _, hit = still.shade(o_w.astype(np.float64), d_w.astype(np.float64))
    alpha = scene.test.images[0, ..., 3].reshape(-1).numpy()
    solid, empty = alpha == 255, alpha == 0
    assert solid.sum() > 100 and empty.sum() > 100
    assert hit[solid].mean() == 1.0 and hit[empty].mean() == 0.0


def test_nerf_to_ngp_matches_instant_ngp():
    m = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [0, 0, 0, 1]], dtype=float)
    out = nerf_to_ngp(m, 0.5, np.array([0.5, 0.5, 0.5]))
    np.testing.assert_allclose(out[:, 0], [5, 9, 1])
    np.testing.assert_allclose(out[:, 1], [-6, -10, -2])
    np.testing.assert_allclose(out[:, 2], [-7, -11, -3])
    np.testing.assert_allclose(out[:, 3], [8 * 0.5 + 0.5, 12 * 0.5 + 0.5, 4 * 0.5 + 0.5])


def write_scene(root, frames, **meta):
    root.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    img = np.full((6, 8, 3), 128, np.uint8)
    for f in frames:
        if f.pop("_write", True):
            name = f["file_path"] if f["file_path"].endswith(".png") else f["file_path"] + ".png"
            cv2.imwrite(str(root / name), img)
    (root / "transforms.json").write_text(json.dumps({"frames": frames, **meta}))
    return root


def frame(name, write=True, m=None):
    return {"file_path": name, "transform_matrix": m if m is not None else np.eye(4).tolist(), "_write": write}


def test_transforms_fields_missing_images_and_extensionless_paths(tmp_path):
    root = write_scene(
        tmp_path / "s",
        [frame("images/a.png"), frame("images/b"), frame("images/c", write=False)],
        camera_angle_x=math.pi / 2,
        aabb_scale=4,
    )
    scene = load_scene(root)
    assert len(scene.train) == 2 and scene.skipped_frames == 1
    fx, fy, cx, cy = scene.train.intrinsics[0].tolist()
    assert fx == pytest.approx(4.0) and fy == pytest.approx(4.0) and (cx, cy) == (4.0, 3.0)
    assert scene.aabb_scale == 4 and scene.aabb.tolist() == [[-1.5] * 3, [2.5] * 3]


@pytest.mark.parametrize(
    "frames, meta, message",
    [
        ([], {}, "no usable frames"),
        ([frame("images/a.png", m=[[1, 0, 0], [0, 1, 0]])], {"camera_angle_x": 1}, r"transform_matrix must be 4x4"),
        ([frame("images/a.png", m=[[float("nan")] * 4] * 4)], {"camera_angle_x": 1}, "NaN"),
        ([frame("images/a.png")], {}, "no focal length"),
        ([frame("images/gone", write=False)], {"camera_angle_x": 1}, r"no usable frames \(1 listed images are missing"),
    ],
)
def test_bad_transforms_raise_errors_naming_the_file(tmp_path, frames, meta, message):
    root = write_scene(tmp_path / "s", frames, **meta)
    with pytest.raises(SceneError, match=message) as err:
        load_scene(root)
    assert "transforms.json" in str(err.value)


def test_missing_scene_and_invalid_json(tmp_path):
    with pytest.raises(SceneError, match="no such scene"):
        load_scene(tmp_path / "nope")
    (tmp_path / "transforms.json").write_text('{"frames": [')
    with pytest.raises(SceneError, match=r"transforms\.json: invalid JSON at line 1"):
        load_scene(tmp_path)


@pytest.mark.skipif(not (SHARED_DATA / "fox" / "transforms.json").is_file(), reason="../shared/data/fox is absent")
def test_data_info_on_fox_reports_50_images_and_17_skipped(capsys):
    from hvd_ngp.tools.data_info import main

    assert main(["info", str(SHARED_DATA / "fox"), "--holdout_every", "8"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["splits"]["train"] + info["splits"]["test"] == 50 and info["splits"]["test"] == 7
    assert info["skipped_missing_images"] == 17 and info["aabb_scale"] == 4
