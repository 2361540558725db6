"""Looking at a result: camera-path files and their interpolation, depth/normal/opacity outputs, H.264 videos,
mesh and point-cloud export (checked by ray-casting the mesh against the field's opacity mask)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_ARGS

from hvd_ngp.cluster import dist
from hvd_ngp.data.cameras import nerf_to_ngp
from hvd_ngp.errors import CameraPathError, ConfigError
from hvd_ngp.render import StepSchedule
from hvd_ngp.render.camera_path import interpolate_keyframes, matrix_to_quaternion, quaternion_to_matrix
from hvd_ngp.tools.camera_files import load_camera_path

pytest.importorskip("trimesh")
pytest.importorskip("mcubes")
av = pytest.importorskip("av")

CENTRE, RADIUS = 0.5, 0.3
IOU_TINY = 0.75  # what the tiny CPU model's mesh reaches after 48 steps


def random_keys(k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack(
        [np.concatenate([quaternion_to_matrix(rng.normal(size=4)), rng.normal(size=(3, 1))], 1) for _ in range(k)]
    )


def test_keyframe_interpolation_hits_the_keys_and_is_smooth_between_them():
    keys, fov = random_keys(4, 0), np.array([40.0, 55.0, 50.0, 30.0])
    mats, fovs = interpolate_keyframes(keys, fov, 31)  # keys at frames 0, 10, 20, 30
    for j in range(4):
        np.testing.assert_allclose(mats[10 * j], keys[j], atol=1e-9)
        assert fovs[10 * j] == pytest.approx(fov[j])
    rot = mats[:, :, :3]
    np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), np.broadcast_to(np.eye(3), rot.shape), atol=1e-9)
    # smooth: on a fine path, the step from frame to frame changes gradually, across keys too (C1)
    fine, _ = interpolate_keyframes(keys, fov, 3001)
    for signal in (fine[:, :, 3], fine[:, :, :3].reshape(-1, 9)):
        step = np.diff(signal, axis=0)
        assert np.abs(np.diff(step, axis=0)).max() < 0.02 * np.abs(step).max()
    # a straight line of positions with evenly spaced keys stays a straight, evenly paced line
    line = np.stack([np.concatenate([np.eye(3), [[t], [0.0], [0.0]]], 1) for t in range(4)])
    mats, _ = interpolate_keyframes(line, np.full(4, 50.0), 7)
    np.testing.assert_allclose(mats[1:6, 0, 3], [0.5, 1.0, 1.5, 2.0, 2.5], atol=1e-9)


def test_camera_path_files(tmp_path):
    rng = np.random.default_rng(1)
    nerf = [np.concatenate([quaternion_to_matrix(rng.normal(size=4)), rng.normal(size=(3, 1))], 1) for _ in range(3)]
    nerf = [np.concatenate([m, [[0, 0, 0, 1]]]) for m in nerf]
    ns = {
        "camera_type": "perspective",
        "render_width": 64,
        "render_height": 48,
        "fps": 24,
        "seconds": 0.125,
        "camera_path": [{"camera_to_world": m.flatten().tolist(), "fov": 50.0, "aspect": 4 / 3} for m in nerf],
    }
    (tmp_path / "camera_path.json").write_text(json.dumps(ns))
    cams = load_camera_path(tmp_path / "camera_path.json", (80, 80), 0.5, [0.5, 0.4, 0.3], 120)
    assert cams.size == (64, 48) and cams.fps == 24 and cams.c2w.shape == (3, 3, 4) and cams.own_size
    want = np.stack([nerf_to_ngp(m, 0.5, np.array([0.5, 0.4, 0.3])) for m in nerf])
    np.testing.assert_allclose(cams.c2w.numpy(), want, atol=1e-6)
    f = 24 / math.tan(math.radians(25))  # vertical field of view
    np.testing.assert_allclose(cams.intrinsics[0].numpy(), [f, f, 32, 24], rtol=1e-5)
    assert cams.scaled(32).size == (32, 24) and cams.scaled(32).intrinsics[0, 0] == pytest.approx(f / 2, rel=1e-5)

    # instant-ngp base_cam.json: quaternions (x, y, z, w) and positions in ngp space, interpolated
    keys = random_keys(3, 2)
    base = {
        "path": [
            {
                "R": matrix_to_quaternion(m[:, :3]).tolist(),
                "T": m[:, 3].tolist(),
                "fov": 45.0,
                "slice": 0.0,
                "scale": 1.0,
                "aperture_size": 0.0,
            }
            for m in keys
        ],
        "time": 0.0,
    }
    (tmp_path / "base_cam.json").write_text(json.dumps(base))
    cams = load_camera_path(tmp_path / "base_cam.json", (80, 60), 0.33, [0.5] * 3, 9)
    assert cams.c2w.shape == (9, 3, 4) and cams.size == (80, 60) and not cams.own_size
    np.testing.assert_allclose(cams.c2w[[0, 4, 8]].numpy(), keys, atol=1e-6)

    # a transforms.json whose images do not exist: its cameras
    tf = {
        "camera_angle_x": 0.8,
        "w": 40,
        "h": 30,
        "frames": [{"file_path": f"./missing/{i}", "transform_matrix": m.tolist()} for i, m in enumerate(nerf)],
    }
    (tmp_path / "transforms.json").write_text(json.dumps(tf))
    cams = load_camera_path(tmp_path / "transforms.json", (80, 80), 0.33, [0.5] * 3, 120)
    assert cams.size == (40, 30) and cams.c2w.shape == (3, 3, 4)
    np.testing.assert_allclose(cams.c2w[1].numpy(), nerf_to_ngp(nerf[1], 0.33, np.array([0.5] * 3)), atol=1e-6)
    assert cams.intrinsics[0, 0] == pytest.approx(20 / math.tan(0.4), rel=1e-5)

    (tmp_path / "bad.json").write_text(json.dumps({"path": [{"R": [0, 0, 0, 1], "T": [0, 0], "fov": 40}]}))
    with pytest.raises(CameraPathError, match=r"bad.json: path\[0\]\.T must be 3 finite numbers"):
        load_camera_path(tmp_path / "bad.json", (8, 8), 0.33, [0.5] * 3, 4)
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(CameraPathError, match="other.json: not a camera path"):
        load_camera_path(tmp_path / "other.json", (8, 8), 0.33, [0.5] * 3, 4)


class Ball(torch.nn.Module):
    """A nearly hard ball (radius 0.3 at (0.5, 0.5, 0.5)) in the unit box; its colour is (1 - d) / 2 for a
    viewing direction d, so a point seen along -n has colour (1 + n) / 2."""

    def __init__(self):
        super().__init__()
        self.register_buffer("aabb", torch.tensor([[0.0] * 3, [1.0] * 3]))

    def density(self, x, n_rows=None):
        return 400.0 * torch.sigmoid(200 * (RADIUS - (x - CENTRE).norm(dim=-1)))

    def forward(self, x, d, n_rows=None):
        return (1 - d) / 2, self.density(x)


def ball_grid():
    from hvd_ngp.render.occupancy import OccupancyGrid

    grid = OccupancyGrid(torch.tensor([[0.0] * 3, [1.0] * 3]), resolution=8)
    grid.occupied.fill_(True)
    return grid


def test_depth_normal_and_opacity_of_a_ball_are_its_geometry():
    from hvd_ngp.render.outputs import render_outputs

    ball = Ball()
    rho = torch.tensor([0.0, 0.1, 0.2, 0.25, 0.45])  # distance of each ray from the ball's centre
    o = torch.stack([torch.full((5,), -1.0), CENTRE + rho, torch.full((5,), CENTRE)], 1)
    d = torch.tensor([[1.0, 0.0, 0.0]]).expand(5, 3).contiguous()
    out = render_outputs(
        ball,
        ball.density,
        o,
        d,
        ball.aabb,
        ball_grid(),
        StepSchedule.uniform(1 / 512),
        1e-4,
        torch.ones(3),
        chunk=3,
        normal_step=1 / 1024,
    )
    hit = rho < RADIUS
    torch.testing.assert_close(out["opacity"], hit.float(), atol=1e-3, rtol=0)
    surface = 1.0 + CENTRE - (RADIUS**2 - rho[hit] ** 2).sqrt()
    ahead = surface - out["depth"][hit]  # the soft shell (0.005 thick) stops rays a little before r = 0.3
    assert bool((ahead > -2e-3).all() and (ahead < 0.02).all()) and bool((out["depth"][~hit] < 1e-6).all())
    want = torch.stack([-(RADIUS**2 - rho[hit] ** 2).sqrt(), rho[hit], torch.zeros(int(hit.sum()))], 1) / RADIUS
    assert (out["normal"][hit] - want).norm(dim=1).max() < 0.05  # the normals where the shell stops the ray
    assert bool((out["normal"][~hit].norm(dim=1) < 1e-6).all())
    torch.testing.assert_close(out["rgb"][~hit], torch.ones(1, 3).expand(int((~hit).sum()), 3))
    # the PNG mappings: depth near blue, far red, nothing hit the background; normals (n + 1) / 2
    from hvd_ngp.render.outputs import colorize_depth, colorize_normal

    img = colorize_depth(np.array([[1.0, 2.0, 5.0]]), np.array([[1.0, 1.0, 0.0]]), 1.0, 2.0, (1.0, 1.0, 1.0))
    assert img[0, 0, 2] > img[0, 0, 0] > img[0, 0, 1] and img[0, 1, 0] > 10 * img[0, 1, 2] and (img[0, 2] == 255).all()
    assert colorize_normal(np.array([[[1.0, 0.0, -1.0]]]), np.ones((1, 1)), (0, 0, 0)).tolist() == [[[255, 128, 0]]]


def test_ball_mesh_is_the_ball_coloured_from_outside_and_its_silhouette_matches_the_render(tmp_path):
    from hvd_ngp.export.mesh import extract_mesh
    from hvd_ngp.export.silhouette import iou, mesh_silhouette
    from hvd_ngp.render.camera_path import CameraPath, orbit
    from hvd_ngp.tools.render import path_frames
    from hvd_ngp.training.evaluate import ViewRenderer

    dist.init("cpu")
    ball, grid = Ball(), ball_grid()
    # density 20: the sphere where 400 sigmoid(200 (0.3 - r)) = 20, about where the render's opacity reaches 1/2
    mesh = extract_mesh(ball, grid, resolution=40, threshold=20.0)
    v = np.asarray(mesh.vertices)
    r = np.linalg.norm(v - CENTRE, axis=1)
    assert len(mesh.faces) > 500 and np.abs(r - (RADIUS + math.log(19) / 200)).max() < 0.015 and mesh.is_watertight
    outward = (v - CENTRE) / r[:, None]
    assert (np.einsum("ij,ij->i", mesh.vertex_normals, outward) > 0.9).mean() > 0.99  # faces wound outward
    colour = np.asarray(mesh.visual.vertex_colors)[:, :3] / 255.0
    assert np.abs(colour - (1 + outward) / 2).max() < 0.1  # the colour network looked along -normal
    import trimesh

    for suffix in (".ply", ".obj", ".glb"):  # every format keeps the vertex colours
        mesh.export(tmp_path / f"ball{suffix}")
        back = trimesh.load(tmp_path / f"ball{suffix}", force="mesh", process=False)
        assert len(back.faces) == len(mesh.faces)
        np.testing.assert_array_equal(np.asarray(back.visual.vertex_colors), np.asarray(mesh.visual.vertex_colors))
    c2w = orbit(
        torch.tensor([[[1, 0, 0, 0.5], [0, 0, 1, -1.0], [0, -1, 0, 0.5]]], dtype=torch.float32), [0.0, 0.0, 1.0], 3
    )
    frames = path_frames(CameraPath(c2w, torch.tensor([[80.0, 80.0, 24.0, 20.0]]).expand(3, 4), (48, 40)))
    renderer = ViewRenderer(ball, grid, StepSchedule.uniform(1 / 256), 1e-4)
    for i in range(3):
        mask = renderer.outputs(frames, i, torch.ones(3))["opacity"].numpy() > 0.5
        assert 0.2 < mask.mean() < 0.9 and iou(mesh_silhouette(mesh, frames, i), mask) > 0.95


def test_video_is_h264_a_browser_plays(tmp_path):
    import cv2

    from hvd_ngp.tools.video import write_mp4

    paths = []
    for i in range(5):  # odd sizes: cropped to even for yuv420p
        img = np.zeros((21, 33, 3), np.uint8)
        img[:, : 6 * (i + 1)] = (40 * i, 200, 255 - 40 * i)
        paths.append(tmp_path / f"f{i}.png")
        cv2.imwrite(str(paths[-1]), img)
    write_mp4(paths, tmp_path / "v.mp4", 12)
    with av.open(str(tmp_path / "v.mp4")) as c:
        s = c.streams.video[0]
        assert s.codec_context.name == "h264" and s.codec_context.pix_fmt == "yuv420p"
        assert (s.codec_context.width, s.codec_context.height) == (32, 20) and s.average_rate == 12
        frames = [f.to_ndarray(format="bgr24") for f in c.decode(s)]
    assert len(frames) == 5
    for i, f in enumerate(frames):  # the content too: the coloured band grows frame by frame
        assert abs(int((f[10, :, 1] > 100).sum()) - min(6 * (i + 1), 32)) <= 2


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, scene_cache):
    from hvd_ngp.config import CPU_CONFIG, parse_args
    from hvd_ngp.training.trainer import run

    out = tmp_path_factory.mktemp("export")
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
                "--n_steps",
                "48",
                "--n_eval_views",
                "0",
                "--out_dir",
                str(out / "o"),
                "--save_snapshot",
                str(out / "s.pt"),
            ]
        )
    )
    return out / "s.pt"


def scene_files(snapshot):
    """The built-in scene's transforms_test.json the snapshot was trained on."""
    from hvd_ngp.state.checkpoint import read_snapshot, snapshot_config

    cfg = snapshot_config(read_snapshot(snapshot, "cpu"))["args"]
    return Path(cfg["scene_cache"]).glob("builtin-*/transforms_test.json")


def test_export_and_render_tools_on_a_trained_snapshot(snapshot, tmp_path):
    import trimesh

    from hvd_ngp.tools.export import main as export
    from hvd_ngp.tools.render import main as render

    mesh = export(["mesh", str(snapshot), "--out", str(tmp_path / "m.ply"), "--resolution", "32", "--device", "cpu"])
    assert mesh["faces"] > 100 and trimesh.load(tmp_path / "m.ply").visual.vertex_colors.shape[0] == mesh["vertices"]
    score = export(["iou", str(snapshot), "--mesh", str(tmp_path / "m.ply"), "--views", "1", "--device", "cpu"])
    assert score["iou_mean"] > IOU_TINY  # the tiny model after 48 steps (lego after training: >= 0.95 on the GPU)
    cloud = export(
        [
            "pointcloud",
            str(snapshot),
            "--out",
            str(tmp_path / "p.ply"),
            "--max_points",
            "2000",
            "--views",
            "2",
            "--opacity_cut",
            "0.5",
            "--device",
            "cpu",
        ]
    )
    pts = trimesh.load(tmp_path / "p.ply")
    assert 200 < len(pts.vertices) == cloud["points"] <= 2400 and pts.colors.shape == (len(pts.vertices), 4)
    # in the scene file's world: inside the scene box (the unit cube of ngp space: +-0.5 / 0.33) and on the mesh
    v = np.asarray(pts.vertices)
    assert np.abs(v).max() < 0.5 / 0.33
    near = trimesh.proximity.ProximityQuery(trimesh.load(tmp_path / "m.ply"))
    assert np.median(np.abs(near.signed_distance(v[:200]))) < 0.1  # within about a lattice cell (3 / 31)

    # the test cameras as a transforms.json of poses only (its images absent), rendered with depth and normals
    tf = json.loads(next(scene_files(snapshot)).read_text())
    tf["frames"] = tf["frames"][:2]
    (tmp_path / "poses.json").write_text(json.dumps(tf))
    out = render(
        [
            "--load_snapshot",
            str(snapshot),
            "--out_dir",
            str(tmp_path / "r"),
            "--split_views",
            "0",
            "--camera_path",
            str(tmp_path / "poses.json"),
            "--outputs",
            "rgb,depth,normal",
            "--video_size",
            "16",
            "--device",
            "cpu",
        ]
    )
    assert out["frames"] == 2 and sorted(out["videos"]) == ["depth", "normal", "rgb"]
    with av.open(out["videos"]["depth"]) as c:
        assert c.streams.video[0].codec_context.name == "h264" and len(list(c.decode(video=0))) == 2
    depth = np.load(tmp_path / "r" / "poses_frames" / "depth_0001.npy")
    assert depth.shape == (16, 16) and 0.8 < out["depth_range"][0] < out["depth_range"][1] < 1.6  # 3.6 x 0.33 away
    with pytest.raises(ConfigError, match="--outputs rgb,dpth: unknown output dpth"):
        render(["--load_snapshot", str(snapshot), "--outputs", "rgb,dpth"])
    with pytest.raises(ConfigError, match=r"--out m.stl: a mesh is written as .ply, .obj, .glb"):
        export(["mesh", str(snapshot), "--out", "m.stl"])
    with pytest.raises(ConfigError, match="--mesh .*no_such.ply: no such file"):  # not trimesh's traceback
        export(["iou", str(snapshot), "--mesh", str(tmp_path / "no_such.ply"), "--device", "cpu"])
    normal = np.load(tmp_path / "r" / "poses_frames" / "normal_0001.npy")
    lit = np.linalg.norm(normal, axis=-1) > 0.5
    assert lit.mean() > 0.2 and np.allclose(np.linalg.norm(normal[lit], axis=-1), 1, atol=1e-4)


def front_camera(w: int, h: int, f: float):
    """One pinhole camera at the origin of ngp space looking along +z (x right, y down), ``w`` x ``h`` pixels."""
    from hvd_ngp.data import Frames

    return Frames(
        torch.zeros(1, 1, 1, 4, dtype=torch.uint8),
        torch.tensor([[[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]]),
        torch.tensor([[f, f, w / 2, h / 2]]),
        torch.zeros(1, 6),
        torch.tensor([[w, h]]),
    )


RED, GREEN, BLUE = np.array([255.0, 0, 0]), np.array([0, 255.0, 0]), np.array([0, 0, 255.0])


def test_mesh_picture_is_the_faces_colours_where_the_resized_camera_sees_them():
    import trimesh

    from hvd_ngp.export.picture import AMBIENT, GREY, mesh_picture, picture_camera

    # a square at z = 2, |x|, |y| < 0.5, its corners red, green, blue, red; the 32x24 camera drawn at 64x48
    corners = [[-0.5, -0.5, 2], [0.5, -0.5, 2], [0.5, 0.5, 2], [-0.5, 0.5, 2]]
    square = trimesh.Trimesh(corners, [[0, 1, 2], [0, 2, 3]], vertex_colors=[RED, GREEN, BLUE, RED], process=False)
    camera = picture_camera(front_camera(32, 24, 20.0), 0, 64)
    assert camera.image_size(0) == (64, 48)
    rgb, drawn = mesh_picture(square, camera, (1.0, 1.0, 1.0))
    # by hand: pixel centre (x + 0.5, y + 0.5) looks along ((x + 0.5 - 32) / 40, (y + 0.5 - 24) / 40, 1)
    y, x = np.mgrid[0:48, 0:64] + 0.5
    dx, dy = (x - 32) / 40, (y - 24) / 40
    s, t = 2 * dx + 0.5, 2 * dy + 0.5  # where the ray meets the square, in its corner coordinates [0, 1]^2
    inside = (s > 0) & (s < 1) & (t > 0) & (t < 1)
    assert int(inside.sum()) == 20 * 20 and (drawn == inside).all()
    upper = (s >= t)[..., None]  # face 0 (corners 0, 1, 2), else face 1 (corners 0, 2, 3)
    colour = np.where(upper, (1 - s)[..., None] * RED, (1 - t)[..., None] * RED + (t - s)[..., None] * RED)
    colour += np.where(upper, (s - t)[..., None] * GREEN + t[..., None] * BLUE, s[..., None] * BLUE)
    shade = AMBIENT + (1 - AMBIENT) / np.sqrt(dx**2 + dy**2 + 1)
    want = np.where(inside[..., None], colour * shade[..., None], 255.0)
    assert np.abs(rgb.astype(float) - want).max() <= 1.0
    # without colours: grey, shaded the same; the background black
    rgb, _ = mesh_picture(trimesh.Trimesh(corners, [[0, 1, 2], [0, 2, 3]], process=False), camera, (0.0, 0.0, 0.0))
    want = np.where(inside[..., None], np.asarray(GREY) * shade[..., None], 0.0)
    assert np.abs(rgb.astype(float) - want).max() <= 1.0


def test_points_picture_puts_each_point_where_the_camera_projects_it_and_the_nearest_wins():
    from hvd_ngp.data.cameras import pixel_rays
    from hvd_ngp.export.picture import points_picture, project

    camera = front_camera(64, 48, 40.0)

    def at(px: int, py: int, z: float) -> list[float]:  # the point at depth z seen through pixel (px, py)'s centre
        return [(px + 0.5 - 32) * z / 40, (py + 0.5 - 24) * z / 40, z]

    yellow, cyan = np.array([255.0, 255, 0]), np.array([0, 255.0, 255])
    pts = [at(10, 5, 2.0), at(50, 40, 4.0), at(20, 30, 6.0), at(20, 30, 3.0), at(40, 10, 1.5), at(40, 10, 5.0)]
    pts.append([0.0, 0.0, -2.0])  # behind the camera: not drawn
    cols = np.array([RED, GREEN, BLUE, yellow, cyan, RED, GREEN]).astype(np.uint8)
    rgb, drawn = points_picture(np.array(pts), cols, camera, (1.0, 1.0, 1.0), point_px=1)
    assert sorted(zip(*np.nonzero(drawn))) == [(5, 10), (10, 40), (30, 20), (40, 50)]  # (row, column)
    assert rgb[5, 10].tolist() == [255, 0, 0] and rgb[40, 50].tolist() == [0, 255, 0]
    assert rgb[30, 20].tolist() == [255, 255, 0] and rgb[10, 40].tolist() == [0, 255, 255]  # nearer, listed 2nd/1st
    assert (rgb[~drawn] == 255).all()
    # discs 3 pixels across (3x3 at a pixel centre): a far blue disc beside a near red one shows where it is uncovered
    rgb, drawn = points_picture(np.array([at(21, 30, 6.0), at(20, 30, 2.0)]), None, camera, (0, 0, 0), point_px=3)
    assert int(drawn.sum()) == 12 and drawn[29:32, 19:23].all()
    rgb, _ = points_picture(np.array([at(21, 30, 6.0), at(20, 30, 2.0)]), cols[[2, 0]], camera, (0, 0, 0), point_px=3)
    assert (rgb[29:32, 19:22] == [255, 0, 0]).all() and (rgb[29:32, 22] == [0, 0, 255]).all()
    # with lens distortion (pinhole and fisheye): the pixel ray through a projected point passes through it
    rng = np.random.default_rng(0)
    p = rng.uniform([-0.4, -0.3, 1.0], [0.4, 0.3, 2.0], size=(20, 3))
    for fisheye, k in ((False, [0.05, -0.02, 0.0, 0.0, 0.001, -0.002]), (True, [0.03, -0.01, 0.002, 0.0, 0, 0])):
        camera.distortion[0] = torch.tensor(k)
        camera.fisheye[0] = fisheye
        u, v, depth, front = project(p, camera)
        o, d = pixel_rays(
            camera.c2w.expand(20, 3, 4).double(),
            camera.intrinsics.expand(20, 4).double(),
            torch.from_numpy(u),
            torch.from_numpy(v),
            camera.distortion.expand(20, 6).double(),
            camera.fisheye.expand(20),
        )
        assert front.all() and np.abs(d.numpy() - p / np.linalg.norm(p, axis=1)[:, None]).max() < 1e-6
        np.testing.assert_allclose(depth, np.linalg.norm(p, axis=1))


def test_picture_command_draws_the_tiny_models_mesh_and_a_cloud_in_the_scene_files_world(snapshot, tmp_path, capsys):
    import cv2
    import trimesh

    from hvd_ngp.data import load_scene
    from hvd_ngp.data.cameras import nerf_to_ngp_points, ngp_to_nerf_points
    from hvd_ngp.export.silhouette import iou, mesh_silhouette
    from hvd_ngp.tools.export import main as export

    scene_dir = str(next(scene_files(snapshot)).parent)
    export(["mesh", str(snapshot), "--out", str(tmp_path / "m.glb"), "--resolution", "32", "--device", "cpu"])
    capsys.readouterr()
    result = export(
        ["picture", str(tmp_path / "m.glb"), "--scene", scene_dir, "--view", "1", "--size", "80"]
        + ["--out", str(tmp_path / "m.png"), "--json", str(tmp_path / "m.json")]
    )
    assert json.loads((tmp_path / "m.json").read_text()) == result and result["size"] == [80, 80]
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and "m.glb (mesh) from test view 1 at 80x80" in line and "m.png" in line
    png = cv2.cvtColor(cv2.imread(str(tmp_path / "m.png")), cv2.COLOR_BGR2RGB)  # as people see it
    drawn = (png != 255).any(axis=2)
    # the same rays as the silhouette check: the mesh moved into ngp space here, the camera the scene's own
    mesh = trimesh.load(tmp_path / "m.glb", force="mesh", process=False)
    scene = load_scene(scene_dir)
    mesh.vertices = nerf_to_ngp_points(np.asarray(mesh.vertices), scene.scale, scene.offset)
    silhouette = mesh_silhouette(mesh, scene.test, 1)
    assert 0.05 < silhouette.mean() < 0.95 and iou(drawn, silhouette) > 0.99
    assert result["drawn_fraction"] == pytest.approx(silhouette.mean(), abs=0.01)
    colours = np.asarray(mesh.visual.vertex_colors)[:, :3].astype(float)
    lo, hi = colours.min(0) * 0.35 - 1, colours.max(0) + 1  # the mesh's colours times the shading
    assert ((png[drawn] >= lo) & (png[drawn] <= hi)).all()

    # a cloud written in the scene file's world: two points on the camera's rays through two pixels
    c2w, (fx, fy, cx, cy) = scene.train.c2w[2].double().numpy(), scene.train.intrinsics[2].tolist()
    pixels, colour = [(10, 20), (60, 45)], np.array([[255, 0, 0, 255], [0, 0, 255, 255]], np.uint8)
    rays = np.array([[(px + 0.5 - cx) / fx, (py + 0.5 - cy) / fy, 1.0] for px, py in pixels])
    points = c2w[:, 3] + 0.8 * rays @ c2w[:, :3].T
    trimesh.PointCloud(ngp_to_nerf_points(points, scene.scale, scene.offset), colors=colour).export(tmp_path / "p.ply")
    result = export(
        ["picture", str(tmp_path / "p.ply"), "--scene", scene_dir, "--split", "train", "--view", "2"]
        + ["--size", "80", "--point_px", "1", "--background", "black", "--out", str(tmp_path / "p.png")]
    )
    png = cv2.cvtColor(cv2.imread(str(tmp_path / "p.png")), cv2.COLOR_BGR2RGB)
    assert result["kind"] == "points" and sorted(zip(*np.nonzero(png.any(axis=2)))) == [(20, 10), (45, 60)]
    assert png[20, 10].tolist() == [255, 0, 0] and png[45, 60].tolist() == [0, 0, 255]

    # bad input: one line naming the file or the option
    with pytest.raises(ConfigError, match=r"no_such.ply: no such file"):
        export(["picture", str(tmp_path / "no_such.ply"), "--scene", scene_dir, "--out", str(tmp_path / "x.png")])
    (tmp_path / "lines.obj").write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\n")
    with pytest.raises(ConfigError, match=r"lines.obj: a mesh without faces"):
        export(["picture", str(tmp_path / "lines.obj"), "--scene", scene_dir, "--out", str(tmp_path / "x.png")])
    with pytest.raises(ConfigError, match=r"--view 8: .* has 8 test views \(0 to 7\)"):
        export(["picture", str(tmp_path / "m.glb"), "--scene", scene_dir, "--view", "8", "--out", "x.png"])


def test_inference_sweep_renders_each_setting_to_the_same_image(snapshot, tmp_path, capsys, monkeypatch):
    """benchmarks/inference_sweep.py (a GPU benchmark) on the CPU: one row per setting in the order given, each
    setting's windows in force while it renders (two_pass's or single_pass's), the same picture under each, the
    table printed, and the render constants back to their defaults afterwards."""
    import importlib.util

    import hvd_ngp.render.fast as fast
    import hvd_ngp.render.infer as infer
    import hvd_ngp.render.plan as plan
    from hvd_ngp.render.volume import INFERENCE_MATH
    from hvd_ngp.tools import render

    assert INFERENCE_MATH != "tf32"  # the fifth setting asks for another math than the default
    before = plan.MAX_CHUNK_RAYS, fast.FIRST_WINDOW, fast.WINDOW_GROWTH, fast.INFERENCE_LAUNCH, infer.WINDOWS
    seen = []
    main = render.main

    def watched(argv):
        seen.append((fast.FIRST_WINDOW, fast.WINDOW_GROWTH, infer.WINDOWS))
        return main(argv)

    monkeypatch.setattr(render, "main", watched)
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("inference_sweep", root / "benchmarks" / "inference_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    # the third: a 4x coarser ray step; the fourth: the colour network on composited samples only; the fifth:
    # tf32 math (the default is fp16), which a torch-backend field ignores; the sixth: rays stop at transmittance
    # 0.5, the torch update, the host's row count, 2^14 rows per call; then one view under the profiler (the last
    # setting's), its timeline written
    settings = (
        "two_pass:10:4:2,single_pass:12:4:8:128,single_pass:12:4:8::64,density_first:12:4:8,single_pass:12:2:16:::tf32,"
        "single_pass:12:4:8::::0.5:torch:host:14"
    )
    argv = ["--views", "1", "--device", "cpu", "--json", str(tmp_path / "s.json"), "--profile", "1"]
    argv += ["--trace", str(tmp_path / "trace.json")]
    rows = sweep.main([str(snapshot), "--settings", settings, *argv])
    segment = fast.INFERENCE_LAUNCH.segment
    keys = ("path", "chunk_rays", "windows", "segment", "steps_per_diagonal", "math", "early_termination", "update")
    assert [tuple(r[k] for k in keys) for r in rows] == [
        ("two_pass", 1024, "4:2", segment, None, INFERENCE_MATH, None, "fused"),
        ("single_pass", 4096, "4:8", 128, None, INFERENCE_MATH, None, "fused"),
        ("single_pass", 4096, "4:8", segment, 64, INFERENCE_MATH, None, "fused"),
        ("density_first", 4096, "4:8", segment, None, INFERENCE_MATH, None, "fused"),
        ("single_pass", 4096, "2:16", segment, None, "tf32", None, "fused"),
        ("single_pass", 4096, "4:8", segment, None, INFERENCE_MATH, 0.5, "torch"),
    ]
    assert [(r["row_count"], r["max_rows"]) for r in rows] == [("device", plan.MAX_ROWS)] * 5 + [("host", 1 << 14)]
    assert seen[0][:2] == seen[1][:2] == (4, 2) and seen[0][2] == before[4]  # two_pass's windows, a warm-up and all
    assert [w[2] for w in seen[2:11:2]] == [infer.InferenceWindows(*w) for w in ((4, 8),) * 3 + ((2, 16),) + ((4, 8),)]
    assert len(seen) == 13 and seen[12][2] == before[4]  # the profiled view: the default windows
    assert rows[0]["psnr"] == rows[1]["psnr"] != rows[2]["psnr"] and all(r["seconds_per_view"] > 0 for r in rows)
    assert rows[3]["psnr"] == pytest.approx(rows[1]["psnr"], abs=1e-4)  # NGPField.colour on the kept rows alone
    assert rows[4]["psnr"] == rows[1]["psnr"]  # a torch-backend field: the kernels' math is not its (test_render)
    assert rows[5]["psnr"] < rows[1]["psnr"] - 0.2  # rays stopped at half their transmittance: a worse picture
    written = json.loads((tmp_path / "s.json").read_text())
    assert written["rows"] == rows
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    profile = written["profile"]
    assert profile["views"] == 1 and profile["device"] == "cpu" and profile["render_ms_per_view"] > 0
    assert profile["rays_per_view"] == 0  # the CPU renders by the reference, which the counts do not see
    assert profile["kernels"] and 0 < sum(k["ms_per_view"] for k in profile["kernels"]) <= profile["own_ms_per_view"]
    out = capsys.readouterr().out
    assert (
        f"| single_pass | 2^12 | 4:8 | 128 | snapshot | {INFERENCE_MATH} |" in out
        and f"| 4:8 | {segment} | 64 |" in out
    )
    assert (plan.MAX_CHUNK_RAYS, fast.FIRST_WINDOW, fast.WINDOW_GROWTH, fast.INFERENCE_LAUNCH, infer.WINDOWS) == before
    assert infer.FUSED_UPDATE is True and infer.DEVICE_ROW_COUNT is True and plan.MAX_ROWS == 1 << 23
