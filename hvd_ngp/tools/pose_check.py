"""``python -m hvd_ngp.tools.pose_check ESTIMATED.json REFERENCE.json``: how far one set of poses is from another.

Frames are matched by image file name (without folder and extension). The estimated camera centres
are aligned to the reference ones by the least-squares similarity (Umeyama: scale, rotation,
translation); then, per frame, the rotation error is the angle between the aligned and the
reference camera orientations (``rotation_deg``: rotated by that similarity, the stricter number;
``rotation_deg_orientation_fit``: by the rotation that best fits the orientations themselves, which
a nearly collinear or planar camera path pins down better), and the centre error is the distance between the centres as a
percentage of the scene size (the largest distance between two reference cameras). Prints JSON
with the medians and maxima.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SceneError, read_json_object, run_cli
from ..options import options_from


def umeyama(src: np.ndarray, dst: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Similarity (s, R ``[3, 3]``, t ``[3]``) minimising sum |s R src_i + t - dst_i|^2. src, dst ``[N, 3]``."""
    mu_s, mu_d = src.mean(0), dst.mean(0)
    xs, xd = src - mu_s, dst - mu_d
    cov = xd.T @ xs / len(src)
    u, d, vt = np.linalg.svd(cov)
    sign = np.eye(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[2, 2] = -1
    rot = u @ sign @ vt
    var = (xs**2).sum() / len(src)
    s = float(np.trace(np.diag(d) @ sign) / var) if var > 0 else 1.0
    return s, rot, mu_d - s * rot @ mu_s


def _angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Angles in degrees ``[N]`` between rotations ``a`` and ``b`` ``[N, 3, 3]``."""
    rel = np.einsum("nji,njk->nik", a, b)  # a^T b
    return np.degrees(np.arccos(np.clip((np.trace(rel, axis1=1, axis2=2) - 1) / 2, -1, 1)))


def mean_rotation(est: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The rotation ``[3, 3]`` G minimising sum |G est_i - ref_i|_F^2 (chordal mean of ref_i est_i^T)."""
    u, _, vt = np.linalg.svd(np.einsum("nij,nkj->ik", ref, est))
    sign = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt))])
    return u @ sign @ vt


def pose_errors(est: np.ndarray, ref: np.ndarray) -> dict:
    """Errors of camera-to-world poses ``est`` against ``ref`` (both ``[N, 3|4, 4]``, same convention)."""
    if len(est) < 3:
        raise SceneError(f"pose_check needs at least 3 frames in common, got {len(est)}")
    s, rot, t = umeyama(est[:, :3, 3], ref[:, :3, 3])
    centres = (s * (rot @ est[:, :3, 3].T)).T + t
    size = max(np.linalg.norm(ref[:, None, :3, 3] - ref[None, :, :3, 3], axis=-1).max(), 1e-12)
    centre_err = np.linalg.norm(centres - ref[:, :3, 3], axis=1) / size * 100
    rot_err = _angles(rot @ est[:, :3, :3], ref[:, :3, :3])
    fit_err = _angles(mean_rotation(est[:, :3, :3], ref[:, :3, :3]) @ est[:, :3, :3], ref[:, :3, :3])
    return {
        "frames": int(len(est)),
        "scale": s,
        "rotation_deg": {"median": float(np.median(rot_err)), "max": float(rot_err.max())},
        "rotation_deg_orientation_fit": {"median": float(np.median(fit_err)), "max": float(fit_err.max())},
        "centre_pct_of_scene": {"median": float(np.median(centre_err)), "max": float(centre_err.max())},
        "scene_size": float(size),
    }


def read_poses(path: Path) -> dict[str, np.ndarray]:
    """``{image stem: camera-to-world [4, 4]}`` from a transforms.json (the matrices as written)."""
    data = read_json_object(path, SceneError, "transforms JSON")
    out = {}
    for i, f in enumerate(data.get("frames") or []):
        try:
            m = np.asarray(f["transform_matrix"], dtype=np.float64)
            out[Path(f["file_path"]).stem] = np.vstack([m[:3], [0, 0, 0, 1]])
        except (KeyError, TypeError, ValueError):
            raise SceneError(f"{path}: frames[{i}] needs file_path and a 4x4 transform_matrix") from None
    if not out:
        raise SceneError(f"{path}: no frames")
    return out


def compare_files(estimated: Path, reference: Path) -> dict:
    est, ref = read_poses(estimated), read_poses(reference)
    common = sorted(set(est) & set(ref))
    result = pose_errors(np.stack([est[k] for k in common]), np.stack([ref[k] for k in common]))
    return {
        "estimated": str(estimated),
        "reference": str(reference),
        "reference_frames_without_estimate": len(set(ref) - set(est)),
        **result,
    }


@dataclass(frozen=True)
class PoseCheckOptions:
    """The two transforms.json files to compare."""

    estimated: Path
    reference: Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m hvd_ngp.tools.pose_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("estimated", type=Path, help="transforms.json with the recovered poses")
    p.add_argument("reference", type=Path, help="transforms.json with the reference poses")
    opts = options_from(PoseCheckOptions, p.parse_args(argv))
    print(json.dumps(compare_files(opts.estimated, opts.reference), indent=1))
    return 0


def cli(argv: list[str] | None = None) -> None:
    run_cli(main, argv, prog="pose_check")


if __name__ == "__main__":
    cli()
