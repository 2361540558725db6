"""``hvd-ngp-data process``: photos or a video -> a posed ``transforms.json`` scene, by COLMAP (pycolmap).

Steps: frames (a folder of images, or a video sampled at ``--fps`` with OpenCV) are copied into
``OUT/images`` (downscaled to ``--max_size`` on the long side when asked) with their sharpness
(variance of the Laplacian); COLMAP extracts SIFT features from copies at ``--colmap_size``,
matches them (exhaustive, or sequential for long videos) and maps incrementally with one shared
camera (``--camera_model``, OPENCV by default). The largest reconstruction becomes
``OUT/transforms.json`` in the NeRF convention, as instant-ngp's colmap2nerf writes it: z up (the
cameras' mean up), centred on the point the cameras look at (the sparse points' median when they
look in parallel), scaled so cameras sit 4 units from the centre on average; ``aabb_scale`` is
the smallest power of two whose cube holds 95% of the sparse points. ``applied_transform`` is the
3x4 map from COLMAP's world to the file's (nerfstudio's meaning). Intrinsics and distortion are
given at the resolution of ``OUT/images``.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ..data.images import IMAGE_EXTENSIONS, read_image
from ..errors import SceneError
from ..render.camera_path import nearest_point_to_lines

#: COLMAP camera model -> the transforms.json fields its parameters fill, in COLMAP's order
CAMERA_PARAMS = {
    "SIMPLE_PINHOLE": ("f", "cx", "cy"),
    "PINHOLE": ("fl_x", "fl_y", "cx", "cy"),
    "SIMPLE_RADIAL": ("f", "cx", "cy", "k1"),
    "RADIAL": ("f", "cx", "cy", "k1", "k2"),
    "OPENCV": ("fl_x", "fl_y", "cx", "cy", "k1", "k2", "p1", "p2"),
    "OPENCV_FISHEYE": ("fl_x", "fl_y", "cx", "cy", "k1", "k2", "k3", "k4"),
}
CAMERA_DISTANCE = 4.0  # mean camera distance from the centre in the output (NeRF units), as colmap2nerf
NGP_SCALE = 0.33  # instant-ngp's default ``scale``: the output is meant to be read with it


@dataclass
class Options:
    max_size: int = 0  # long side of OUT/images (0: as captured)
    colmap_size: int = 640  # long side of the images COLMAP sees
    camera_model: str = "OPENCV"
    fps: float = 2.0
    matcher: str = "auto"  # auto | exhaustive | sequential
    min_registered: float = 0.5
    threads: int = -1
    quiet: bool = False


def sharpness(image_rgb: np.ndarray) -> float:
    """Variance of the Laplacian of the grey image ``[H, W, 3|4]`` uint8 (higher: sharper)."""
    grey = cv2.cvtColor(np.ascontiguousarray(image_rgb[..., :3]), cv2.COLOR_RGB2GRAY)
    return float(cv2.Laplacian(grey, cv2.CV_64F).var())


def _resize_long(image: np.ndarray, long_side: int) -> np.ndarray:
    h, w = image.shape[:2]
    if long_side <= 0 or max(h, w) <= long_side:
        return image
    s = long_side / max(h, w)
    return cv2.resize(image, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)


def _progress(total: int, desc: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=quiet, file=sys.stderr, leave=False)


def video_frames(video: Path, fps: float, quiet: bool = False) -> list[np.ndarray]:
    """Frames ``[H, W, 3]`` RGB sampled from ``video`` at about ``fps`` per second (OpenCV)."""
    cap = cv2.VideoCapture(str(video))
    if not cap.isOpened():
        raise SceneError(f"{video}: cannot open the video (missing, or a codec OpenCV lacks)")
    src_fps = cap.get(cv2.CAP_PROP_FPS) or 0.0
    count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
    step = max(1, round(src_fps / fps)) if src_fps > 0 and fps > 0 else 1
    out, index = [], 0
    with _progress(count, "video frames", quiet) as bar:
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            if index % step == 0:
                out.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
            index += 1
            bar.update(1)
    cap.release()
    if not out:
        raise SceneError(f"{video}: no frames could be decoded")
    return out


def folder_images(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise SceneError(f"{folder}: no such folder of images")
    paths = sorted(p for p in folder.iterdir() if p.suffix in IMAGE_EXTENSIONS and p.is_file())
    if not paths:
        raise SceneError(f"{folder}: no images ({', '.join(sorted(set(e.lower() for e in IMAGE_EXTENSIONS)))})")
    return paths


def write_frames(frames, names: list[str], out: Path, colmap_dir: Path, opt: Options) -> list[dict]:
    """Write ``OUT/images/NAME`` and the COLMAP copies; frames are arrays ``[H, W, 3]`` RGB or paths."""
    (out / "images").mkdir(parents=True, exist_ok=True)
    colmap_dir.mkdir(parents=True, exist_ok=True)
    records = []
    with _progress(len(names), "images", opt.quiet) as bar:
        for frame, name in zip(frames, names):
            rgb = read_image(frame)[..., :3] if isinstance(frame, Path) else frame
            big = _resize_long(rgb, opt.max_size)
            small = _resize_long(big, opt.colmap_size)
            bgr = cv2.cvtColor(np.ascontiguousarray(big), cv2.COLOR_RGB2BGR)
            if isinstance(frame, Path) and big is rgb and frame.suffix.lower() in (".jpg", ".jpeg", ".png"):
                shutil.copyfile(frame, out / "images" / name)
            elif not cv2.imwrite(str(out / "images" / name), bgr):
                raise SceneError(f"{out / 'images' / name}: cannot write the image")
            cv2.imwrite(str(colmap_dir / name), cv2.cvtColor(np.ascontiguousarray(small), cv2.COLOR_RGB2BGR))
            records.append(
                {
                    "name": name,
                    "size": (big.shape[1], big.shape[0]),
                    "colmap_size": (small.shape[1], small.shape[0]),
                    "sharpness": sharpness(small),
                }
            )
            bar.update(1)
    return records


def run_colmap(image_dir: Path, work: Path, names: list[str], opt: Options):
    """Features, matches and incremental mapping -> the reconstruction with the most registered images."""
    try:
        import pycolmap
    except ImportError:
        raise SceneError("pycolmap is not installed (pip install pycolmap): it runs COLMAP") from None
    pycolmap.logging.minloglevel = 2 if opt.quiet else 1
    db = work / "database.db"
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = opt.camera_model
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = opt.threads
    extraction.use_gpu = False
    say = (lambda *a: None) if opt.quiet else (lambda msg: print(f"process: {msg}", file=sys.stderr, flush=True))
    say(f"COLMAP: features of {len(names)} images")
    pycolmap.extract_features(
        db,
        image_dir,
        image_names=names,
        camera_mode=pycolmap.CameraMode.SINGLE,
        reader_options=reader,
        extraction_options=extraction,
        device=pycolmap.Device.cpu,
    )
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = opt.threads
    matching.use_gpu = False
    sequential = opt.matcher == "sequential" or (opt.matcher == "auto" and len(names) > 150)
    say(f"COLMAP: {'sequential' if sequential else 'exhaustive'} matching")
    if sequential:
        pycolmap.match_sequential(db, matching_options=matching, device=pycolmap.Device.cpu)
    else:
        pycolmap.match_exhaustive(db, matching_options=matching, device=pycolmap.Device.cpu)
    mapping = pycolmap.IncrementalPipelineOptions()
    mapping.num_threads = opt.threads
    (work / "sparse").mkdir(exist_ok=True)
    with _progress(len(names), "COLMAP mapping", opt.quiet) as bar:
        recs = pycolmap.incremental_mapping(
            db, image_dir, work / "sparse", options=mapping, next_image_callback=lambda: bar.update(1)
        )
    if not recs:
        raise SceneError(
            f"{image_dir}: COLMAP registered none of the {len(names)} images (too little texture or "
            "overlap between them: {})".format(_listing(names))
        )
    return max(recs.values(), key=lambda r: r.num_reg_images())


def _listing(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def camera_fields(camera, scale: float) -> dict:
    """A pycolmap camera -> transforms.json intrinsics at ``scale`` times COLMAP's resolution."""
    model = camera.model_name if hasattr(camera, "model_name") else str(camera.model).split(".")[-1]
    if model not in CAMERA_PARAMS:
        raise SceneError(f"COLMAP camera model {model} is not supported (use one of {', '.join(CAMERA_PARAMS)})")
    values = dict(zip(CAMERA_PARAMS[model], [float(v) for v in camera.params]))
    if "f" in values:
        values["fl_x"] = values["fl_y"] = values.pop("f")
    out: dict[str, str | float] = {"camera_model": "OPENCV_FISHEYE" if model == "OPENCV_FISHEYE" else "OPENCV"}
    for k in ("fl_x", "fl_y", "cx", "cy"):
        out[k] = values[k] * scale
    for k in ("k1", "k2", "k3", "k4", "p1", "p2"):
        if k in values:
            out[k] = values[k]
    if model in ("SIMPLE_PINHOLE", "PINHOLE"):
        out["camera_model"] = "PINHOLE"
    return out


def look_centre(centres: np.ndarray, forwards: np.ndarray) -> np.ndarray | None:
    """The point nearest to all optical axes (least squares), or None when they are nearly parallel.
    centres, forwards ``[N, 3]``."""
    point, condition = nearest_point_to_lines(np.asarray(centres, np.float64), np.asarray(forwards, np.float64))
    return None if condition > 1e4 else point


def _rotation_to_z(up: np.ndarray) -> np.ndarray:
    """The rotation ``[3, 3]`` taking unit vector ``up`` to +z (Rodrigues)."""
    z = np.array([0.0, 0.0, 1.0])
    v, c = np.cross(up, z), float(up @ z)
    if np.linalg.norm(v) < 1e-9:
        return np.eye(3) if c > 0 else np.diag([1.0, -1.0, -1.0])
    k = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return np.eye(3) + k + k @ k * (1.0 / (1.0 + c))


def normalise(c2w_cv: np.ndarray, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """COLMAP world -> output world: the NeRF camera-to-world matrices ``[N, 4, 4]``, the applied
    transform ``[3, 4]`` and aabb_scale. c2w_cv ``[N, 3, 4]`` (right, down, forward); points ``[P, 3]``."""
    centres, forwards, ups = c2w_cv[:, :, 3], c2w_cv[:, :, 2], -c2w_cv[:, :, 1]
    up = ups.mean(0)
    up /= np.linalg.norm(up)
    rot = _rotation_to_z(up)
    centre = look_centre(centres, forwards)
    if centre is None or not np.isfinite(centre).all():
        centre = np.median(points, 0) if len(points) else centres.mean(0)
    dist = np.linalg.norm(centres - centre, axis=1).mean()
    s = CAMERA_DISTANCE / max(dist, 1e-9)
    applied = np.concatenate([s * rot, (-s * rot @ centre)[:, None]], 1)
    out = np.tile(np.eye(4), (len(c2w_cv), 1, 1))
    out[:, :3, :3] = rot @ c2w_cv[:, :, :3] @ np.diag([1.0, -1.0, -1.0])
    out[:, :3, 3] = (s * (rot @ (centres - centre).T)).T
    aabb_scale = 1
    if len(points):
        p = (s * (rot @ (points - centre).T)).T * NGP_SCALE  # ngp units around the cube centre
        reach = float(np.quantile(np.abs(p).max(1), 0.95))
        while aabb_scale < 128 and 0.5 * aabb_scale < reach:
            aabb_scale *= 2
    return out, applied, aabb_scale


def reconstruction_transforms(rec, records: list[dict], scale: float) -> dict:
    """A pycolmap reconstruction -> the transforms.json object (frames in ``records`` order)."""
    by_name = {img.name: img for img in rec.images.values() if img.has_pose}
    kept = [r for r in records if r["name"] in by_name]
    c2w_cv = []
    for r in kept:
        m = np.asarray(
            by_name[r["name"]].cam_from_world().matrix()
            if callable(by_name[r["name"]].cam_from_world)
            else by_name[r["name"]].cam_from_world.matrix(),
            dtype=np.float64,
        )
        rot, t = m[:, :3], m[:, 3]
        c2w_cv.append(np.concatenate([rot.T, (-rot.T @ t)[:, None]], 1))
    points = np.array([p.xyz for p in rec.points3D.values()], dtype=np.float64).reshape(-1, 3)
    c2w, applied, aabb_scale = normalise(np.stack(c2w_cv), points)
    camera = next(iter(rec.cameras.values()))
    w, h = kept[0]["size"]
    data = {
        **camera_fields(camera, scale),
        "w": w,
        "h": h,
        "aabb_scale": aabb_scale,
        "applied_transform": np.round(applied, 9).tolist(),
        "colmap": {"registered": len(kept), "images": len(records), "points": int(len(points))},
        "frames": [
            {
                "file_path": f"images/{r['name']}",
                "sharpness": round(r["sharpness"], 3),
                "transform_matrix": np.round(m, 9).tolist(),
            }
            for r, m in zip(kept, c2w)
        ],
    }
    return data


def process(out: Path, images: Path | None = None, video: Path | None = None, opt: Options | None = None) -> dict:
    """Run the whole capture -> scene conversion; returns the transforms.json object written to ``OUT``."""
    opt = opt or Options()
    if opt.camera_model not in CAMERA_PARAMS:
        raise SceneError(f"--camera_model must be one of {', '.join(CAMERA_PARAMS)}, got {opt.camera_model!r}")
    frames: list[np.ndarray] | list[Path]
    if video is not None:
        frames = video_frames(video, opt.fps, opt.quiet)
        names = [f"frame_{i:05d}.png" for i in range(len(frames))]
        source = video
    elif images is not None:
        frames = folder_images(images)
        names = [p.name for p in frames]
        source = images
    else:
        raise SceneError("process: give a folder of images or a video")
    if len(frames) < 3:
        raise SceneError(f"{source}: {len(frames)} frame(s); COLMAP needs at least 3 overlapping views")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="colmap-", dir=out) as tmp:
        work = Path(tmp)
        records = write_frames(frames, names, out, work / "images", opt)
        rec = run_colmap(work / "images", work, names, opt)
        registered = {img.name for img in rec.images.values() if img.has_pose}
        lost = [n for n in names if n not in registered]
        if len(registered) < max(3, math.ceil(opt.min_registered * len(names))):
            raise SceneError(
                f"{source}: COLMAP registered only {len(registered)} of {len(names)} images (needs "
                f"{opt.min_registered:.0%}); not registered: {_listing(lost)}"
            )
        scale = records[0]["size"][0] / records[0]["colmap_size"][0]
        data = reconstruction_transforms(rec, records, scale)
    if lost and not opt.quiet:
        print(f"process: {len(lost)} image(s) not registered, left out: {_listing(lost)}", file=sys.stderr)
    (out / "transforms.json").write_text(json.dumps(data, indent=1))
    return data
