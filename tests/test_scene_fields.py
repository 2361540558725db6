"""Every transforms.json field changes the generated rays the way it should; LLFF scenes load."""

from __future__ import annotations

import json
import math

import cv2
import numpy as np
import pytest
import torch

from hvd_ngp.data import cameras, load_scene
from hvd_ngp.data.cameras import distort, undistort
from hvd_ngp.data.sampler import image_rays
from hvd_ngp.errors import SceneError

CPU = torch.device("cpu")


def scene_with(tmp_path, frame_fields=None, size=(8, 6), n=1, sizes=None, **meta):
    """A one-folder scene: n grey images and identity poses, plus the given fields."""
    root = tmp_path / "scene"
    (root / "img").mkdir(parents=True, exist_ok=True)
    frames = []
    for i in range(n):
        w, h = sizes[i] if sizes else size
        cv2.imwrite(str(root / "img" / f"{i}.png"), np.full((h, w, 3), 100 + i, np.uint8))
        frames.append(
            {"file_path": f"img/{i}", "transform_matrix": np.eye(4).tolist(), **(frame_fields or [{}] * n)[i]}
        )
    (root / "transforms.json").write_text(json.dumps({"frames": frames, **meta}))
    return load_scene(root)


def center_dir(scene, i=0):
    o, d = image_rays(scene.train, i, CPU)
    return o, d


def test_focal_from_angle_matches_focal_in_pixels(tmp_path):
    a = scene_with(tmp_path / "a", camera_angle_x=2 * math.atan(4 / 10))  # w = 8: fl_x = 10
    b = scene_with(tmp_path / "b", fl_x=10.0)
    torch.testing.assert_close(a.train.intrinsics, b.train.intrinsics)
    torch.testing.assert_close(center_dir(a)[1], center_dir(b)[1])
    assert a.train.intrinsics[0, 0] == pytest.approx(10.0)


def test_principal_point_shifts_the_rays(tmp_path):
    a = scene_with(tmp_path / "a", fl_x=10.0)
    b = scene_with(tmp_path / "b", fl_x=10.0, cx=5.0, cy=3.0)
    # a pixel centre at (u, v) looks along ((u - cx)/f, (v - cy)/f, 1) in camera space (ngp camera: x right, y down)
    _, d = center_dir(b)
    u, v = 5.5, 3.5  # pixel (5, 3)
    idx = 3 * 8 + 5
    cam = np.array([(u - 5.0) / 10, (v - 3.0) / 10, 1.0])
    cam /= np.linalg.norm(cam)
    c2w = b.train.c2w[0, :, :3].numpy()
    np.testing.assert_allclose(d[idx].numpy(), c2w @ cam, atol=1e-6)
    assert not torch.allclose(center_dir(a)[1], d)


def test_scale_and_offset_move_the_camera(tmp_path):
    m = np.eye(4)
    m[:3, 3] = [1.0, 2.0, 3.0]
    a = scene_with(tmp_path / "a", [{"transform_matrix": m.tolist()}], fl_x=10.0, scale=0.5, offset=[0.1, 0.2, 0.3])
    o, _ = center_dir(a)
    # NeRF (x, y, z) -> ngp (y, z, x) * scale + offset
    torch.testing.assert_close(o[0], torch.tensor([2.0 * 0.5 + 0.1, 3.0 * 0.5 + 0.2, 1.0 * 0.5 + 0.3]))
    b = scene_with(tmp_path / "b", [{"transform_matrix": m.tolist()}], fl_x=10.0)  # defaults 0.33, 0.5
    torch.testing.assert_close(center_dir(b)[0][0], torch.tensor([2 * 0.33 + 0.5, 3 * 0.33 + 0.5, 0.33 + 0.5]))


def test_distortion_round_trip_and_effect(tmp_path):
    k = torch.tensor([[0.1, -0.05, 0.01, 0.0, 0.002, -0.001]]).expand(50, 6)
    x, y = torch.rand(50) - 0.5, torch.rand(50) - 0.5
    xd, yd = distort(x, y, k)
    xu, yu = undistort(xd, yd, k)
    torch.testing.assert_close(xu, x, atol=1e-6, rtol=0)
    torch.testing.assert_close(yu, y, atol=1e-6, rtol=0)
    plain = scene_with(tmp_path / "a", fl_x=4.0)
    bent = scene_with(tmp_path / "b", fl_x=4.0, k1=0.2)
    _, d0 = center_dir(plain)
    _, d1 = center_dir(bent)
    # barrel distortion (k1 > 0): a corner pixel's ray is bent towards the axis after undistortion
    ang0 = torch.acos(d0[0] @ plain.train.c2w[0, :, 2])
    ang1 = torch.acos(d1[0] @ bent.train.c2w[0, :, 2])
    assert ang1 < ang0


@pytest.mark.parametrize("fisheye", [False, True], ids=["opencv", "fisheye"])
def test_newton_with_a_tolerance_stops_early_at_the_same_solution(fisheye, monkeypatch):
    """The direction maps' solve (one camera's coefficients broadcast, ``tol``) stops after a few iterations
    (start-up of distorted scenes: fox's maps took 15 s with 10 iterations) and matches the 10-iteration one
    (here in float64; the maps solve in float32, checked against the exact rays by the test below)."""
    calls = []
    real = cameras.converged
    monkeypatch.setattr(cameras, "converged", lambda step, tol: calls.append(tol) or real(step, tol))
    k = torch.tensor([0.0578, -0.0805, 0.0, 0.0, -0.00098, 0.00016], dtype=torch.float64)
    if fisheye:
        k[4:] = 0
    x, y = (torch.rand(2, 4000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) - 0.5) * 1.6
    solve = cameras.fisheye_directions if fisheye else cameras.pinhole_directions
    full = solve(x, y, k.expand(4000, 6))
    assert calls == [None] * 10  # no tolerance: every iteration, no early stop
    calls.clear()
    fast = solve(x, y, k[None], tol=cameras.MAP_TOL)
    assert 2 <= len(calls) <= 6, len(calls)
    torch.testing.assert_close(fast, full, atol=1e-9, rtol=0)


@pytest.mark.parametrize(
    "fisheye, k",
    [
        (False, [0.0] * 6),
        (False, [0.0578, -0.0805, 0.01, 0.0, -0.00098, 0.00016]),
        (True, [0.0] * 6),
        (True, [0.03, -0.01, 0.002, 0.001, 0.0, 0.0]),
    ],
    ids=["pinhole", "opencv", "fisheye", "fisheye-k"],
)
def test_one_camera_rays_equal_the_per_ray_model(fisheye, k, monkeypatch):
    """``camera_rays`` (a whole image of one camera: renders, exports) gives ``pixel_rays``' rays, which
    solve both projections for every ray with 10 Newton iterations; and without distortion it solves nothing."""
    g = torch.Generator().manual_seed(3)
    c2w = torch.linalg.qr(torch.randn(3, 3, generator=g))[0]
    c2w = torch.cat([c2w, torch.randn(3, 1, generator=g)], 1)
    intr = torch.tensor([700.0, 690.0, 401.5, 299.0])
    u, v = torch.rand(2, 5000, generator=g) * torch.tensor([[800.0], [600.0]])
    dist = torch.tensor(k)
    n = u.shape[0]
    o_ref, d_ref = cameras.pixel_rays(
        c2w.expand(n, 3, 4), intr.expand(n, 4), u, v, dist.expand(n, 6), torch.tensor(fisheye).expand(n)
    )
    solves = []
    real = cameras.converged
    monkeypatch.setattr(cameras, "converged", lambda step, tol: solves.append(tol) or real(step, tol))
    o, d = cameras.camera_rays(c2w, intr, u, v, dist, fisheye)
    assert o.shape == d.shape == (n, 3)
    assert solves == [] if not any(k) else 1 <= len(solves) <= 6
    torch.testing.assert_close(o, o_ref, atol=0, rtol=0)
    torch.testing.assert_close(d, d_ref, atol=2e-6, rtol=0)


def test_fisheye_rays_use_the_equidistant_model(tmp_path):
    s = scene_with(tmp_path, fl_x=4.0, is_fisheye=True)
    _, d = center_dir(s)
    u, v = 0.5, 0.5  # pixel (0, 0); centre at (4, 3)
    r = math.hypot((u - 4) / 4, (v - 3) / 4)
    forward = s.train.c2w[0, :, 2]
    assert float(torch.acos(d[0] @ forward)) == pytest.approx(r, rel=1e-5)  # angle = radius / f


def test_per_frame_intrinsics_override_and_mixed_sizes(tmp_path):
    s = scene_with(
        tmp_path / "a",
        [{"fl_x": 5.0, "w": 8, "h": 6}, {"fl_x": 7.0, "w": 10, "h": 4}],
        n=2,
        sizes=[(8, 6), (10, 4)],
        fl_x=3.0,
    )
    assert s.train.intrinsics[:, 0].tolist() == [5.0, 7.0]
    assert s.train.sizes.tolist() == [[8, 6], [10, 4]] and s.train.n_pixels == 48 + 40
    img, y, x = s.train.locate(torch.tensor([0, 47, 48, 87]))
    assert img.tolist() == [0, 0, 1, 1] and y.tolist() == [0, 5, 0, 3] and x.tolist() == [0, 7, 0, 9]
    assert image_rays(s.train, 1, CPU)[1].shape == (40, 3)
    with pytest.raises(SceneError, match="different sizes"):
        scene_with(tmp_path / "b", n=2, sizes=[(8, 6), (10, 4)], fl_x=3.0)


def test_sharpness_threshold_discards_blurry_frames(tmp_path):
    root = tmp_path / "s"
    scene_with(root, [{"sharpness": 10.0}, {"sharpness": 100.0}, {"sharpness": 50.0}], n=3, fl_x=4.0)
    s = load_scene(root / "scene", sharpness_threshold=40.0)
    assert len(s.train) == 2 and s.skipped_sharpness == 1


def write_llff(root, n=8, h=12, w=16, focal=20.0, near=2.0, far=10.0, subfolder="images"):
    (root / subfolder).mkdir(parents=True)
    rows = []
    for i in range(n):
        # LLFF columns: down, right, backward, centre, (h, w, focal); cameras on a small line, facing -z
        pose = np.zeros((3, 5))
        pose[:, 0] = [0, -1, 0]  # down
        pose[:, 1] = [1, 0, 0]  # right
        pose[:, 2] = [0, 0, 1]  # backward
        pose[:, 3] = [0.1 * i, 0, 0]
        pose[:, 4] = [h, w, focal]
        rows.append(np.concatenate([pose.reshape(-1), [near, far]]))
        cv2.imwrite(str(root / subfolder / f"{i:03d}.png"), np.full((h, w, 3), 20 * i, np.uint8))
    np.save(root / "poses_bounds.npy", np.array(rows))


def test_llff_scene_loads_with_holdout_and_points_forward(tmp_path):
    write_llff(tmp_path / "llff")
    s = load_scene(tmp_path / "llff", holdout_every=4)
    assert len(s.train) == 6 and len(s.test) == 2
    assert s.train.intrinsics[0].tolist() == [20.0, 20.0, 8.0, 6.0]
    # every camera sits inside the scene bounds and looks into the cube, where the content was placed
    o, d = image_rays(s.train, 0, CPU)
    centre = o[0] + d[(6 // 2) * 16 + 16 // 2] * 0.5
    assert torch.all((o[0] > s.aabb[0]) & (o[0] < s.aabb[1]))
    assert torch.all((centre > -0.1) & (centre < 1.1))


def test_llff_prefers_downscaled_folder(tmp_path):
    write_llff(tmp_path / "llff", h=12, w=16, focal=20.0)
    write_llff(tmp_path / "tmp2", h=6, w=8, focal=20.0, subfolder="images_2")
    (tmp_path / "tmp2" / "images_2").rename(tmp_path / "llff" / "images_2")
    s = load_scene(tmp_path / "llff", downscale=2, holdout_every=0)
    assert s.train.sizes[0].tolist() == [8, 6] and s.train.intrinsics[0, 0] == pytest.approx(10.0)


def test_direction_maps_match_exact_undistortion(tmp_path):
    """The sampler's precomputed direction maps give the same rays as undistorting each ray exactly."""
    from hvd_ngp.data.cameras import pixel_rays
    from hvd_ngp.data.sampler import RaySampler

    for fields in ({"k1": 0.15, "k2": -0.05, "p1": 0.01, "p2": -0.005}, {"is_fisheye": True, "k1": 0.05}):
        s = scene_with(tmp_path / str(len(fields)), fl_x=24.0, size=(24, 18), n=2, **fields)
        sampler = RaySampler(s.train, 0, 1, 0, CPU)
        assert sampler.direction_maps is not None
        img, y, x = s.train.locate(torch.randint(0, s.train.n_pixels, (500,)))
        u = x.float() + torch.rand(500)
        v = y.float() + torch.rand(500)
        exact = pixel_rays(
            s.train.c2w[img], s.train.intrinsics[img], u, v, s.train.distortion[img], s.train.fisheye[img]
        )[1]
        c2w = s.train.c2w[img]
        mapped = torch.einsum("nij,nj->ni", c2w[:, :, :3], sampler.direction_maps.directions(img, u, v))
        mapped = mapped / mapped.norm(dim=-1, keepdim=True)
        # interpolation error of the smooth distortion: below 1% of a pixel's angular size (1 / 24 rad here)
        torch.testing.assert_close(mapped, exact, atol=0.01 / 24, rtol=0)
