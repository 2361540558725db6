"""``hvd-ngp-export``: a trained snapshot as a coloured mesh or point cloud, and the mesh's silhouette check.

    hvd-ngp-export mesh SNAPSHOT --out lego.ply [--resolution 256 --threshold 2.5]   (.ply, .obj or .glb)
    hvd-ngp-export pointcloud SNAPSHOT --out lego_points.ply [--opacity_cut 0.9 --max_points 1000000]
    hvd-ngp-export iou SNAPSHOT [--mesh lego.ply] [--views N]   mesh silhouette vs the field's opacity mask
    hvd-ngp-export picture lego.ply --scene data/lego --out lego.png [--view N --split test|train --size 800]

Files are written in the scene file's world (the coordinates of its transforms.json; ``--space ngp``: the
trainer's ngp space). One process; the device as the render tool picks it (``--device``). ``picture`` reads
no snapshot: it draws an exported file from one of the scene's cameras (``export.picture``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..cluster import dist
from ..data import Frames, Scene, load_scene
from ..data.cameras import nerf_to_ngp_points, ngp_to_nerf_points
from ..errors import ConfigError, HvdNgpError, run_cli
from ..export.mesh import DEFAULT_RESOLUTION, DEFAULT_THRESHOLD, MESH_SUFFIXES, extract_mesh
from ..export.picture import mesh_picture, picture_camera, points_picture, read_geometry
from ..export.pointcloud import DEFAULT_MAX_POINTS, DEFAULT_OPACITY_CUT, point_cloud
from ..export.silhouette import MASK_OPACITY, iou, mesh_silhouette
from ..options import command_options
from ..training.evaluate import BACKGROUNDS, write_png
from .trained import Trained, load_trained


@dataclass(frozen=True)
class Command:
    """An ``hvd-ngp-export`` command (``main``'s parser holds the options' help)."""

    what: str  # the command: mesh | pointcloud | iou | picture


@dataclass(frozen=True)
class ExportOptions(Command):
    """The options every command that reads a snapshot takes."""

    snapshot: str
    scene: str | None
    device: str
    space: str  # scene | ngp: the coordinates of the files
    background: str | None
    gpu_memory_gb: float


@dataclass(frozen=True)
class SurfaceOptions(ExportOptions):
    """A command that extracts the marching-cubes surface."""

    resolution: int
    threshold: float
    box: str | None  # JSON [[x0, y0, z0], [x1, y1, z1]] in ngp space, checked by ``parse_box``


@dataclass(frozen=True)
class MeshOptions(SurfaceOptions):
    """``hvd-ngp-export mesh``."""

    out: str


@dataclass(frozen=True)
class PointCloudOptions(ExportOptions):
    """``hvd-ngp-export pointcloud``."""

    out: str
    opacity_cut: float
    max_points: int
    views: int  # the first N training views (0: all)


@dataclass(frozen=True)
class IouOptions(SurfaceOptions):
    """``hvd-ngp-export iou``."""

    mesh: str | None
    views: int  # test views (0: all)
    json: str | None


@dataclass(frozen=True)
class PictureOptions(Command):
    """``hvd-ngp-export picture``: an exported mesh or point cloud drawn from one of the scene's cameras."""

    file: str
    scene: str
    space: str  # scene | ngp: the coordinates of the file
    split: str | None  # test | train (None: test, else train when the scene has no test views)
    view: int
    size: int  # the longer image side in pixels
    point_px: float
    background: str
    out: str
    json: str | None


COMMANDS: dict[str, type[Command]] = {
    "mesh": MeshOptions,
    "pointcloud": PointCloudOptions,
    "iou": IouOptions,
    "picture": PictureOptions,
}


def need_trimesh() -> None:
    try:
        import mcubes  # noqa: F401
        import trimesh  # noqa: F401
    except ImportError as exc:
        raise HvdNgpError(
            f"hvd-ngp-export needs trimesh and PyMCubes ({exc.name} is missing): "
            "pip install trimesh PyMCubes (and embreex for fast ray casting)"
        ) from None


def parse_box(text: str | None) -> torch.Tensor | None:
    if text is None:
        return None
    try:
        box = torch.tensor(json.loads(text), dtype=torch.float32)
    except (ValueError, TypeError):
        box = None
    if box is None or box.shape != (2, 3) or not bool((box[1] > box[0]).all()):
        raise ConfigError(f"--box {text}: expected [[xmin, ymin, zmin], [xmax, ymax, zmax]] (ngp space) with max > min")
    return box


def to_file_space(points: np.ndarray, scene: Scene, space: str) -> np.ndarray:
    """Points ``[N, 3]`` in ngp space -> the files' coordinates (``--space``)."""
    return points if space == "ngp" else ngp_to_nerf_points(points, scene.scale, scene.offset)


def from_file_space(points: np.ndarray, scene: Scene, space: str) -> np.ndarray:
    """Points ``[N, 3]`` in the files' coordinates (``--space``) -> ngp space."""
    return points if space == "ngp" else nerf_to_ngp_points(points, scene.scale, scene.offset)


def export_mesh(opts: MeshOptions, trained: Trained) -> dict:
    mesh = extract_mesh(trained.field, trained.grid, opts.resolution, opts.threshold, parse_box(opts.box))
    mesh.vertices = to_file_space(np.asarray(mesh.vertices), trained.scene, opts.space)
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    mesh.export(out)
    dist.log(
        f"mesh: {len(mesh.vertices)} vertices, {len(mesh.faces)} faces (resolution {opts.resolution}, "
        f"threshold {opts.threshold}) -> {out}"
    )
    return {"out": str(out), "vertices": len(mesh.vertices), "faces": len(mesh.faces)}


def export_pointcloud(opts: PointCloudOptions, trained: Trained) -> dict:
    import trimesh
    from tqdm import tqdm

    frames = trained.scene.train
    if frames.images is None and frames.files is None:
        raise HvdNgpError(f"{opts.snapshot}: the scene has no training cameras")
    points, colours = point_cloud(
        trained.renderer(),
        frames,
        trained.background(opts.background),
        opts.opacity_cut,
        opts.max_points,
        progress=lambda v: tqdm(v, desc="views", unit="view", delay=2.0),
        n_views=opts.views,
    )
    if len(points) == 0:
        raise HvdNgpError(
            f"{opts.snapshot}: no pixel of the training views is more opaque than --opacity_cut {opts.opacity_cut}"
        )
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    trimesh.PointCloud(to_file_space(points, trained.scene, opts.space), colors=colours).export(out)
    n = len(frames) if opts.views <= 0 else min(opts.views, len(frames))
    dist.log(f"point cloud: {len(points)} points from {n} training views (opacity > {opts.opacity_cut}) -> {out}")
    return {"out": str(out), "points": len(points)}


def silhouette_iou(opts: IouOptions, trained: Trained) -> dict:
    """IoU of the mesh's silhouette (ray-cast) and the field's opacity mask (> ``MASK_OPACITY``) per test view."""
    import trimesh
    from tqdm import tqdm

    if opts.mesh:
        if not Path(opts.mesh).is_file():
            raise ConfigError(f"--mesh {opts.mesh}: no such file")
        mesh = trimesh.load(opts.mesh, force="mesh", process=False)
        assert isinstance(mesh, trimesh.Trimesh)  # force="mesh"
        mesh.vertices = from_file_space(np.asarray(mesh.vertices), trained.scene, opts.space)
    else:
        mesh = extract_mesh(trained.field, trained.grid, opts.resolution, opts.threshold, parse_box(opts.box))
    frames = trained.scene.test
    n = len(frames) if opts.views <= 0 else min(opts.views, len(frames))
    if n == 0:
        raise HvdNgpError(f"{opts.snapshot}: the scene has no test views")
    renderer, bg = trained.renderer(), trained.background()
    scores = []
    for i in tqdm(range(n), desc="views", unit="view", delay=2.0):
        mask = renderer.outputs(frames, i, bg)["opacity"].cpu().numpy() > MASK_OPACITY
        scores.append(iou(mesh_silhouette(mesh, frames, i), mask))
    result = {
        "mesh": opts.mesh or "extracted",
        "views": n,
        "iou_mean": float(np.mean(scores)),
        "iou_min": float(np.min(scores)),
        "iou_per_view": [round(s, 4) for s in scores],
    }
    dist.log(f"mesh silhouette IoU over {n} test views: mean {result['iou_mean']:.4f}, min {result['iou_min']:.4f}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=1))
    return result


def picture_view(scene: Scene, opts: PictureOptions) -> tuple[str, Frames]:
    """The split and frames of the camera ``opts`` asks for; a missing split or view is a ``ConfigError``."""
    split = opts.split or ("test" if len(scene.test) else "train")
    frames = scene.test if split == "test" else scene.train
    if len(frames) == 0:
        raise ConfigError(f"--split {split}: {opts.scene} has no {split} views")
    if not 0 <= opts.view < len(frames):
        raise ConfigError(f"--view {opts.view}: {opts.scene} has {len(frames)} {split} views (0 to {len(frames) - 1})")
    return split, frames


def export_picture(opts: PictureOptions) -> dict:
    """Draw ``opts.file`` (a mesh or a point cloud in ``--space`` coordinates) from one of the scene's cameras
    into a PNG; returns what it drew (and writes it to ``--json``)."""
    import trimesh

    geometry = read_geometry(Path(opts.file))
    scene = load_scene(opts.scene, lazy_train=True)  # the training images' pixels are not needed
    split, frames = picture_view(scene, opts)
    camera = picture_camera(frames, opts.view, opts.size)
    vertices = from_file_space(np.asarray(geometry.vertices, dtype=np.float64), scene, opts.space)
    background = BACKGROUNDS[opts.background]
    if isinstance(geometry, trimesh.PointCloud):
        colours = np.asarray(geometry.colors)
        has_colours = colours.ndim == 2 and len(colours) == len(vertices)
        rgb, drawn = points_picture(vertices, colours if has_colours else None, camera, background, opts.point_px)
    else:
        geometry.vertices = vertices
        rgb, drawn = mesh_picture(geometry, camera, background)
    write_png(Path(opts.out), rgb)
    w, h = camera.image_size(0)
    result = {
        "file": opts.file,
        "kind": "points" if isinstance(geometry, trimesh.PointCloud) else "mesh",
        "split": split,
        "view": opts.view,
        "size": [w, h],
        "drawn_fraction": round(float(drawn.mean()), 6),
        "out": opts.out,
    }
    dist.log(
        f"picture: {opts.file} ({result['kind']}) from {split} view {opts.view} at {w}x{h}, "
        f"{100 * result['drawn_fraction']:.1f}% of the pixels drawn -> {opts.out}"
    )
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="hvd-ngp-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="what", required=True)
    space = argparse.ArgumentParser(add_help=False)
    space.add_argument(
        "--space",
        choices=("scene", "ngp"),
        default="scene",
        help="coordinates of the files: the scene file's world (default) or ngp space",
    )
    common = argparse.ArgumentParser(add_help=False, parents=[space])
    common.add_argument("snapshot", help="snapshot written by the trainer (--save_snapshot)")
    common.add_argument("--scene", default=None, help="scene for the cameras (default: the training scene)")
    common.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    common.add_argument("--background", choices=("white", "black"), default=None)
    common.add_argument("--gpu_memory_gb", type=float, default=0.0)
    surface = argparse.ArgumentParser(add_help=False)
    surface.add_argument(
        "--resolution", type=int, default=DEFAULT_RESOLUTION, help="lattice points along the box's longest side"
    )
    surface.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="density of the surface")
    surface.add_argument(
        "--box",
        default=None,
        metavar="JSON",
        help="[[x0, y0, z0], [x1, y1, z1]] in ngp space (default: the occupied cells' bounds)",
    )
    m = sub.add_parser("mesh", parents=[common, surface], help="marching-cubes mesh with vertex colours")
    m.add_argument("--out", required=True, help="output file: .ply, .obj or .glb")
    c = sub.add_parser("pointcloud", parents=[common], help="coloured points at the training views' depth")
    c.add_argument("--out", required=True, help="output file (.ply)")
    c.add_argument("--opacity_cut", type=float, default=DEFAULT_OPACITY_CUT)
    c.add_argument("--max_points", type=int, default=DEFAULT_MAX_POINTS)
    c.add_argument("--views", type=int, default=0, help="the first N training views (0: all)")
    s = sub.add_parser(
        "iou",
        parents=[common, surface],
        help="a mesh's silhouette IoU against the field's opacity mask on the test views",
    )
    s.add_argument("--mesh", default=None, help="mesh file (in --space coordinates; default: extract one here)")
    s.add_argument("--views", type=int, default=0, help="test views (0: all)")
    s.add_argument("--json", default=None, help="also write the scores here")
    add_picture_parser(sub, space)
    opts = command_options(p.parse_args(argv), "what", COMMANDS)
    if isinstance(opts, PictureOptions):
        check_picture(opts)
        need_trimesh()
        return export_picture(opts)
    assert isinstance(opts, ExportOptions)  # every other command reads a snapshot
    if isinstance(opts, MeshOptions) and Path(opts.out).suffix.lower() not in MESH_SUFFIXES:
        raise ConfigError(f"--out {opts.out}: a mesh is written as {', '.join(MESH_SUFFIXES)}")
    if isinstance(opts, PointCloudOptions) and Path(opts.out).suffix.lower() != ".ply":
        raise ConfigError(f"--out {opts.out}: a point cloud is written as .ply")
    if isinstance(opts, SurfaceOptions) and opts.resolution < 8:
        raise ConfigError(f"--resolution {opts.resolution}: at least 8")
    if isinstance(opts, PointCloudOptions) and not (0 <= opts.opacity_cut < 1 and opts.max_points > 0):
        raise ConfigError("--opacity_cut must be in [0, 1) and --max_points > 0")
    need_trimesh()
    trained = load_trained(opts.snapshot, opts.device, opts.scene, gpu_memory_gb=opts.gpu_memory_gb)
    if isinstance(opts, MeshOptions):
        return export_mesh(opts, trained)
    if isinstance(opts, PointCloudOptions):
        return export_pointcloud(opts, trained)
    assert isinstance(opts, IouOptions)  # COMMANDS has no other
    return silhouette_iou(opts, trained)


def add_picture_parser(sub, space: argparse.ArgumentParser) -> None:
    """``hvd-ngp-export picture``'s options (``sub``: ``main``'s sub-parsers; ``space``: the ``--space`` parent)."""
    q = sub.add_parser(
        "picture",
        parents=[space],
        help="a PNG of an exported mesh or point cloud from one of the scene's cameras (ray-cast, or splatted points)",
    )
    q.add_argument("file", help="a mesh (.ply, .obj, .glb) or a point cloud (.ply without faces) as exported")
    q.add_argument("--scene", required=True, help="the scene whose cameras to draw from (and its coordinates)")
    q.add_argument(
        "--split", choices=("test", "train"), default=None, help="default: test, train when the scene has none"
    )
    q.add_argument("--view", type=int, default=0, help="the camera's index in the split")
    q.add_argument("--size", type=int, default=800, help="the picture's longer side in pixels")
    q.add_argument("--point_px", type=float, default=2.0, help="the diameter of each point's disc in pixels")
    q.add_argument("--background", choices=("white", "black"), default="white")
    q.add_argument("--out", required=True, help="output file (.png)")
    q.add_argument("--json", default=None, help="also write what was drawn here")


def check_picture(opts: PictureOptions) -> None:
    """The picture options' own limits (the file and the view are checked against what they name)."""
    if Path(opts.out).suffix.lower() != ".png":
        raise ConfigError(f"--out {opts.out}: a picture is written as .png")
    if not 8 <= opts.size <= 8192:
        raise ConfigError(f"--size {opts.size}: between 8 and 8192 pixels")
    if not 0.5 <= opts.point_px <= 64:
        raise ConfigError(f"--point_px {opts.point_px}: between 0.5 and 64 pixels")


def cli(argv: list[str] | None = None) -> None:
    """``hvd-ngp-export``: a user error is one line and exit status 2."""
    run_cli(main, argv, prog="hvd-ngp-export")


if __name__ == "__main__":
    cli()
