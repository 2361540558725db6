"""nerfstudio's transforms.json variants: per-frame intrinsics, camera_model, applied_transform,
ply_file_path and mask_path (as alpha, or excluded from training and scoring: ``--mask_mode exclude``), from small
hand-written files."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch

from hvd_ngp.data import load_scene
from hvd_ngp.data.cameras import distort
from hvd_ngp.data.sampler import RaySampler, image_rays
from hvd_ngp.errors import ConfigError, SceneError
from hvd_ngp.tools.data_info import main as data_main
from hvd_ngp.training.evaluate import view_mse

POSE = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 3], [0, 0, 0, 1]]


def write(root, frames, **meta):
    """A scene folder with one 8x6 grey PNG per frame name and transforms.json."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    out = []
    for f in frames:
        f = dict(f)
        name = f.pop("name")
        cv2.imwrite(str(root / "images" / f"{name}.png"), np.full((6, 8, 3), 128, np.uint8))
        out.append({"file_path": f"images/{name}.png", "transform_matrix": POSE, **f})
    (root / "transforms.json").write_text(json.dumps({**meta, "frames": out}, indent=1))
    return root


def test_per_frame_intrinsics_override_the_global_ones(tmp_path):
    scene = load_scene(
        write(
            tmp_path,
            [{"name": "a"}, {"name": "b", "fl_x": 20.0, "fl_y": 21.0, "cx": 3.0, "cy": 2.5, "k1": 0.1, "p2": 0.01}],
            fl_x=10.0,
            fl_y=11.0,
            cx=4.0,
            cy=3.0,
            w=8,
            h=6,
            k1=-0.2,
            camera_model="OPENCV",
        )
    )
    intr, dist = scene.train.intrinsics, scene.train.distortion
    assert intr[0].tolist() == [10.0, 11.0, 4.0, 3.0]
    assert intr[1].tolist() == [20.0, 21.0, 3.0, 2.5]
    # the frame's own k1 replaces the global one; unset keys fall back to the file's (k2..: 0)
    assert dist[0].tolist() == pytest.approx([-0.2, 0, 0, 0, 0, 0])
    assert dist[1].tolist() == pytest.approx([0.1, 0, 0, 0, 0, 0.01])
    assert not scene.train.fisheye.any()


def test_opencv_distortion_bends_the_rays_back_onto_the_undistorted_grid(tmp_path):
    """A pixel at the distorted position of normalised point (x, y) must get the ray through (x, y, 1)."""
    k = dict(k1=-0.3, k2=0.1, p1=0.01, p2=-0.02)
    scene = load_scene(
        write(tmp_path, [{"name": "a"}], fl_x=4.0, fl_y=4.0, cx=4.0, cy=3.0, w=8, h=6, camera_model="OPENCV", **k)
    )
    _, d = image_rays(scene.train, 0, torch.device("cpu"))
    d = d.view(6, 8, 3)
    # pixel centre (u, v) = (6.5, 1.5) is distorted normalised (0.625, -0.375); its ray, in camera space
    c2w = scene.train.c2w[0, :, :3]
    cam = c2w.T @ d[1, 6]
    x, y = cam[0] / cam[2], cam[1] / cam[2]
    kt = torch.tensor([[k["k1"], k["k2"], 0, 0, k["p1"], k["p2"]]], dtype=torch.float64)
    xd, yd = distort(x.double()[None], y.double()[None], kt)
    assert (float(xd), float(yd)) == pytest.approx((0.625, -0.375), abs=1e-4)
    assert abs(float(x) - 0.625) > 0.01  # the distortion is not ignored


def test_opencv_fisheye_model_makes_fisheye_frames(tmp_path):
    scene = load_scene(
        write(tmp_path, [{"name": "a"}], fl_x=4.0, w=8, h=6, k1=0.05, k4=0.01, camera_model="OPENCV_FISHEYE")
    )
    assert scene.train.fisheye.tolist() == [True]
    assert scene.train.distortion[0].tolist() == pytest.approx([0.05, 0, 0, 0.01, 0, 0])
    pinhole = load_scene(write(tmp_path / "p", [{"name": "a"}], fl_x=4.0, w=8, h=6, camera_model="PINHOLE"))
    assert pinhole.train.fisheye.tolist() == [False]


@pytest.mark.parametrize(
    "meta, frame, message",
    [
        ({"camera_model": "EQUIRECTANGULAR"}, {}, "'camera_model' 'EQUIRECTANGULAR' is not supported"),
        ({"camera_model": "PINHOLE", "k1": 0.1}, {}, "'k1' is non-zero but camera_model PINHOLE"),
        ({"camera_model": "OPENCV_FISHEYE", "p1": 0.01}, {}, "'p1' is non-zero but camera_model OPENCV_FISHEYE"),
        ({}, {"camera_model": "FOV"}, "frames[0].'camera_model' 'FOV' is not supported"),
        ({"camera_model": "OPENCV", "is_fisheye": True}, {}, "give 'camera_model' or 'is_fisheye', not both"),
        ({"applied_transform": [[1, 0, 0], [0, 1, 0]]}, {}, "'applied_transform' must be a 3x4"),
        ({}, {"mask_path": "masks/none.png"}, "frames[0].mask_path 'masks/none.png': no such image"),
        ({}, {"mask_path": 3}, "frames[0].mask_path must be a file name"),
    ],
)
def test_bad_nerfstudio_fields_name_the_file_and_key(tmp_path, meta, frame, message):
    root = write(tmp_path, [{"name": "a", **frame}], fl_x=4.0, **meta)
    with pytest.raises(SceneError) as err:
        load_scene(root)
    assert str(root / "transforms.json") in str(err.value)
    assert message in str(err.value)


def test_applied_transform_and_ply_are_noted_not_applied(tmp_path, capsys):
    plain = load_scene(write(tmp_path / "a", [{"name": "a"}], fl_x=4.0))
    root = write(
        tmp_path / "b",
        [{"name": "a"}],
        fl_x=4.0,
        ply_file_path="sparse_pc.ply",
        applied_transform=[[0, 1, 0, 5], [1, 0, 0, 2], [0, 0, -1, 1]],
    )
    noted = load_scene(root)
    assert torch.equal(plain.train.c2w, noted.train.c2w)
    assert data_main(["info", str(root)]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith("applied_transform: recorded only") for n in notes)
    assert any(n.startswith("ply_file_path: ignored ('sparse_pc.ply'") for n in notes)


@pytest.mark.parametrize("lazy", [False, True])
def test_mask_zeroes_alpha_of_masked_pixels(tmp_path, lazy):
    (tmp_path / "masks").mkdir()
    mask = np.full((3, 4), 255, np.uint8)  # half resolution: scaled up to the image
    mask[:, :2] = 0
    cv2.imwrite(str(tmp_path / "masks" / "a.png"), mask)
    scene = load_scene(
        write(tmp_path, [{"name": "a", "mask_path": "masks/a.png"}, {"name": "b"}], fl_x=4.0), lazy_train=lazy
    )
    a = scene.train.files.read(0) if lazy else scene.train.images[0].numpy()
    b = scene.train.files.read(1) if lazy else scene.train.images[1].numpy()
    assert (a[:, :4, 3] == 0).all() and (a[:, 4:, 3] == 255).all()
    assert (a[..., :3] == 128).all()  # colour kept
    assert (b[..., 3] == 255).all()


def masked_scene(root, mode):
    """Two 16x16 frames: 'a' with its 6 left columns masked out (mask 0: through the middle of 4x4 tiles), 'b'
    without a mask."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    mask = np.full((16, 16), 255, np.uint8)
    mask[:, :6] = 0
    cv2.imwrite(str(root / "masks" / "a.png"), mask)
    frames = []
    for name in ("a", "b"):
        cv2.imwrite(str(root / "images" / f"{name}.png"), np.full((16, 16, 3), 128, np.uint8))
        frames.append(
            {
                "file_path": f"images/{name}.png",
                "transform_matrix": POSE,
                **({"mask_path": "masks/a.png"} if name == "a" else {}),
            }
        )
    (root / "transforms.json").write_text(json.dumps({"fl_x": 16.0, "frames": frames}))
    return load_scene(root, mask_mode=mode)


def drawn_pixels(frames, n, scores=False):
    """(image, y, x) ``[n]`` of ``n`` training rays drawn from 4x4 tiles, and their importance weights
    (``scores``: random per-tile scores)."""
    sampler = RaySampler(frames, 0, 1, seed=3, device=torch.device("cpu"), tile_size=4, prefetch=False)
    if scores:
        sampler.set_scores(torch.rand(sampler.grid.n_tiles, generator=torch.Generator().manual_seed(0)))
    batch = sampler.sample(n)
    return frames.locate(batch.pixel), batch.weight


def test_exclude_mask_mode_never_draws_masked_pixels_and_keeps_their_colour(tmp_path):
    scene = masked_scene(tmp_path / "exclude", "exclude")
    images, keep = scene.train.images, scene.train.keep
    assert (images[..., 3] == 255).all() and (images[..., :3] == 128).all()  # nothing turned transparent
    assert not keep[0, :, :6].any() and keep[0, :, 6:].all() and keep[1].all()
    (img, y, x), _ = drawn_pixels(scene.train, 20000)
    assert keep[img, y, x].all()  # no masked pixel drawn
    drawn = torch.zeros_like(keep)
    drawn[img, y, x] = True
    assert torch.equal(drawn, keep)  # every kept pixel drawn (about 48 times each)
    assert abs(float((img == 0).float().mean()) - 160 / 416) < 0.02  # uniform over the kept pixels
    # importance sampling by tile scores: still only kept pixels, and the weights make means over kept pixels
    (img, y, x), weight = drawn_pixels(scene.train, 20000, scores=True)
    assert keep[img, y, x].all() and weight is not None
    assert abs(float((weight * (img == 0)).mean()) - 160 / 416) < 0.03
    # the alpha mode (the default) draws the masked pixels and trains them as transparent
    alpha = masked_scene(tmp_path / "alpha", "alpha")
    assert alpha.train.keep is None and (alpha.train.images[0, :, :6, 3] == 0).all()
    (img, y, x), _ = drawn_pixels(alpha.train, 2000)
    assert ((img == 0) & (x < 6)).any()


def test_exclude_mask_mode_scores_test_views_over_kept_pixels_only(tmp_path):
    scene = masked_scene(tmp_path, "exclude")
    keep = scene.train.keep[0]
    gt = torch.full((16, 16, 3), 0.5)
    img = gt.clone()
    img[:, :6] = 1.0  # wrong only where the mask excludes
    assert view_mse(img, gt, keep) == 0.0
    assert view_mse(img, gt, None) == pytest.approx(0.25 * 6 / 16)
    img[:, 6:] += 0.1
    assert view_mse(img, gt, keep) == pytest.approx(0.01)


def test_mask_mode_must_be_known(tmp_path):
    with pytest.raises(ConfigError, match="--mask_mode must be one of alpha, exclude, got 'ignore'"):
        masked_scene(tmp_path, "ignore")
