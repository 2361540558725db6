"""The built-in scene: a small textured still life, ray-traced analytically, written as a Blender-style
NeRF scene (``transforms_{train,test}.json`` + RGBA PNGs) and cached on disk.

Objects (world units, z up): a checkered sphere, a striped box, a dotted sphere with a colour
gradient and a plinth with concentric rings, Lambert-shaded by a fixed light (view-independent,
so a NeRF can fit it exactly). Every image is rendered with 3x3 supersampling, so edges are
anti-aliased and alpha is fractional at silhouettes. The output depends only on the seed and the
generator version.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np

GENERATOR_VERSION = 1
DEFAULTS = dict(width=80, height=80, n_train=64, n_test=8, camera_angle_x=0.6911, radius=3.6, supersample=3)
LIGHT = np.array([0.4, -0.5, 0.77]) / np.linalg.norm([0.4, -0.5, 0.77])


def _look_at(eye: np.ndarray, target: np.ndarray = np.zeros(3)) -> np.ndarray:
    """Blender/NeRF camera-to-world ``[4, 4]``: columns right, up, backward, centre (z up)."""
    back = eye - target
    back /= np.linalg.norm(back)
    right = np.cross(np.array([0.0, 0.0, 1.0]), back)
    right /= np.linalg.norm(right)
    up = np.cross(back, right)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, up, back, eye
    return m


def _sphere(o: np.ndarray, d: np.ndarray, c: np.ndarray, r: float) -> np.ndarray:
    oc = o - c
    b = (oc * d).sum(-1)
    disc = b * b - ((oc * oc).sum(-1) - r * r)
    t = -b - np.sqrt(np.maximum(disc, 0.0))
    return np.where((disc > 0) & (t > 1e-6), t, np.inf)


def _box(o: np.ndarray, d: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    inv = 1.0 / np.where(np.abs(d) < 1e-12, 1e-12, d)
    t0, t1 = (lo - o) * inv, (hi - o) * inv
    tn, tf = np.minimum(t0, t1).max(-1), np.maximum(t0, t1).min(-1)
    return np.where((tf >= tn) & (tn > 1e-6), tn, np.inf)


class _StillLife:
    """Analytic geometry and textures; ``shade(o, d)`` -> rgb ``[N, 3]``, alpha ``[N]``."""

    def __init__(self, rng: np.random.Generator) -> None:
        jitter = rng.uniform(-0.05, 0.05, size=8)
        self.s1 = (np.array([-0.42 + jitter[0], 0.05 + jitter[1], 0.0]), 0.42)
        self.s2 = (np.array([0.25 + jitter[2], -0.55 + jitter[3], 0.28]), 0.22)
        self.box = (np.array([0.18, 0.12, -0.38]), np.array([0.78, 0.72, 0.30]))
        self.plinth = (np.array([-0.9, -0.9, -0.56]), np.array([0.9, 0.9, -0.38]))
        self.palette = rng.uniform(0.15, 0.95, size=(6, 3))
        self.phase = rng.uniform(0, 2 * math.pi, size=3)

    def shade(self, o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ts = np.stack(
            [_sphere(o, d, *self.s1), _sphere(o, d, *self.s2), _box(o, d, *self.box), _box(o, d, *self.plinth)], axis=-1
        )
        which = ts.argmin(-1)
        t = ts.min(-1)
        hit = np.isfinite(t)
        p = o + d * np.where(hit, t, 0.0)[:, None]
        rgb = np.zeros_like(p)
        normal = np.zeros_like(p)
        P = self.palette

        m = hit & (which == 0)  # checkered sphere (8 x 4 in longitude/latitude)
        n = (p[m] - self.s1[0]) / self.s1[1]
        lon, lat = np.arctan2(n[:, 1], n[:, 0]), np.arcsin(np.clip(n[:, 2], -1, 1))
        check = (np.floor(lon / (2 * math.pi) * 8) + np.floor(lat / math.pi * 4)) % 2
        rgb[m] = np.where(check[:, None] > 0, P[0], P[1])
        normal[m] = n

        m = hit & (which == 1)  # gradient sphere with dots
        n = (p[m] - self.s2[0]) / self.s2[1]
        base = P[2] * (0.5 + 0.5 * n[:, 2:3]) + P[3] * (0.5 - 0.5 * n[:, 2:3])
        dots = np.sin(9 * n[:, 0] + self.phase[0]) * np.sin(9 * n[:, 1] + self.phase[1]) > 0.55
        rgb[m] = np.where(dots[:, None], 1.0 - base, base)
        normal[m] = n

        m = hit & (which == 2)  # striped box: stripes along a different axis per face
        lo, hi = self.box
        q = (p[m] - lo) / (hi - lo)
        axis = np.argmin(np.minimum(np.abs(q), np.abs(1 - q)), axis=-1)
        nb = np.zeros_like(q)
        nb[np.arange(len(q)), axis] = np.where(q[np.arange(len(q)), axis] > 0.5, 1.0, -1.0)
        coord = q[np.arange(len(q)), (axis + 1) % 3]
        stripe = (np.floor(coord * 6) % 2)[:, None]
        rgb[m] = np.where(stripe > 0, P[4], np.array([0.95, 0.95, 0.9]))
        normal[m] = nb

        m = hit & (which == 3)  # plinth with concentric rings on top
        lo, hi = self.plinth
        q = (p[m] - lo) / (hi - lo)
        top = q[:, 2] > 0.99
        r = np.hypot(p[m][:, 0], p[m][:, 1])
        ring = (np.floor(r * 7 + self.phase[2]) % 2)[:, None]
        rgb[m] = np.where(top[:, None], np.where(ring > 0, P[5], 0.25 + 0.5 * P[5][::-1]), 0.35 * P[5])
        axis = np.argmin(np.minimum(np.abs(q), np.abs(1 - q)), axis=-1)
        nb = np.zeros_like(q)
        nb[np.arange(len(q)), axis] = np.where(q[np.arange(len(q)), axis] > 0.5, 1.0, -1.0)
        normal[m] = nb

        light = 0.35 + 0.65 * np.clip((normal * LIGHT).sum(-1), 0.0, 1.0)
        return np.clip(rgb * light[:, None], 0.0, 1.0), hit.astype(np.float64)


def _render(scene: _StillLife, c2w: np.ndarray, width: int, height: int, focal: float, ss: int) -> np.ndarray:
    """RGBA uint8 ``[H, W, 4]`` with ss x ss supersampling; colour is premultiplied then un-premultiplied."""
    offs = (np.arange(ss) + 0.5) / ss
    u = np.arange(width)[None, :, None, None] + offs[None, None, None, :]
    v = np.arange(height)[:, None, None, None] + offs[None, None, :, None]
    u, v = np.broadcast_arrays(u, v)
    x = (u - width / 2) / focal
    y = -(v - height / 2) / focal
    d_cam = np.stack([x, y, -np.ones_like(x)], -1).reshape(-1, 3)
    d = d_cam @ c2w[:3, :3].T
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    o = np.broadcast_to(c2w[:3, 3], d.shape)
    rgb, a = scene.shade(o, d)
    rgb = (rgb * a[:, None]).reshape(height, width, ss * ss, 3).mean(2)
    a = a.reshape(height, width, ss * ss).mean(2)
    rgb = np.where(a[..., None] > 0, rgb / np.maximum(a[..., None], 1e-8), 0.0)
    rgba = np.concatenate([rgb, a[..., None]], -1)
    return (np.clip(rgba, 0, 1) * 255.0 + 0.5).astype(np.uint8)


def _camera_positions(rng: np.random.Generator, n: int, radius: float) -> list[np.ndarray]:
    out = []
    for _ in range(n):
        azim = rng.uniform(0, 2 * math.pi)
        elev = math.asin(rng.uniform(math.sin(math.radians(10)), math.sin(math.radians(70))))
        out.append(
            radius * np.array([math.cos(elev) * math.cos(azim), math.cos(elev) * math.sin(azim), math.sin(elev)])
        )
    return out


def builtin_key(seed: int, **overrides) -> str:
    params = {**DEFAULTS, **overrides, "seed": seed, "version": GENERATOR_VERSION}
    return hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]


def generate_builtin(out_dir: str | os.PathLike, seed: int = 0, **overrides) -> Path:
    """Write the scene into ``out_dir`` (created); returns it."""
    p = {**DEFAULTS, **overrides}
    rng = np.random.default_rng(seed)
    scene = _StillLife(rng)
    w, h, ss = int(p["width"]), int(p["height"]), int(p["supersample"])
    focal = 0.5 * w / math.tan(0.5 * p["camera_angle_x"])
    out = Path(out_dir)
    for split, count in (("train", p["n_train"]), ("test", p["n_test"])):
        (out / split).mkdir(parents=True, exist_ok=True)
        frames = []
        for i, eye in enumerate(_camera_positions(rng, int(count), float(p["radius"]))):
            c2w = _look_at(eye)
            rgba = _render(scene, c2w, w, h, focal, ss)
            cv2.imwrite(str(out / split / f"r_{i:03d}.png"), cv2.cvtColor(rgba, cv2.COLOR_RGBA2BGRA))
            frames.append({"file_path": f"./{split}/r_{i:03d}", "transform_matrix": c2w.round(9).tolist()})
        meta = {
            "camera_angle_x": p["camera_angle_x"],
            "w": w,
            "h": h,
            "aabb_scale": 1,
            "scale": 0.33,
            "offset": [0.5, 0.5, 0.5],
            "generator": {"name": "hvd_ngp.builtin", "version": GENERATOR_VERSION, "seed": seed},
            "frames": frames,
        }
        (out / f"transforms_{split}.json").write_text(json.dumps(meta, indent=1))
    return out


def ensure_builtin(cache_dir: str | os.PathLike, seed: int = 0, **overrides) -> Path:
    """The cached scene folder, generated on first use. Safe when several ranks race: each writes a
    private temporary folder and renames it into place; the content is identical by construction."""
    cache = Path(cache_dir).expanduser()
    target = cache / f"builtin-s{seed}-{builtin_key(seed, **overrides)}"
    if (target / "transforms_test.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".builtin-", dir=cache))
    try:
        generate_builtin(tmp, seed, **overrides)
        try:
            os.rename(tmp, target)
        except OSError:  # another rank won the race
            if not (target / "transforms_test.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
