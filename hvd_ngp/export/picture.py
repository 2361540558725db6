"""A quick picture of an exported mesh or point cloud from one of the scene's cameras, without a GUI.

A mesh is ray-cast (trimesh; Embree when embreex is installed, as ``silhouette``): each pixel's first hit is
coloured by the face's vertex colours interpolated barycentrically, times a headlight Lambert term so the shape
reads. A point cloud is projected with the camera and splatted into a z-buffer (the nearest point wins).
Geometry and cameras are in ngp space (``data.cameras``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..data import Frames
from ..data.cameras import distort, fisheye_distort
from ..data.sampler import image_rays
from ..errors import ConfigError
from .mesh import MESH_SUFFIXES

#: the headlight: a surface facing the camera gets all of its colour, one seen edge-on AMBIENT of it
AMBIENT = 0.35
#: the colour of a mesh or point cloud without colours (RGB, 0..255)
GREY = (180.0, 180.0, 180.0)
#: nearest distance in front of the camera a point is drawn at (ngp units)
NEAR = 1e-6


def picture_camera(frames: Frames, index: int, size: int) -> Frames:
    """Camera ``index`` of ``frames`` as one frame whose longer image side is ``size`` pixels (the intrinsics
    scaled with the image: fx, cx by the width's factor, fy, cy by the height's; distortion unchanged)."""
    w, h = frames.image_size(index)
    k = size / max(w, h)
    nw, nh = max(1, round(w * k)), max(1, round(h * k))
    scale = torch.tensor([nw / w, nh / h, nw / w, nh / h], dtype=torch.float32)
    return Frames(
        torch.zeros(1, 1, 1, 4, dtype=torch.uint8),  # no pixels: only the camera is used
        frames.c2w[index : index + 1].cpu(),
        frames.intrinsics[index : index + 1].cpu() * scale,
        frames.distortion[index : index + 1].cpu(),
        torch.tensor([[nw, nh]]),
        frames.fisheye[index : index + 1].cpu(),
    )


def read_geometry(path: Path):
    """``path`` -> a ``trimesh.Trimesh`` with faces, or a ``trimesh.PointCloud`` (a .ply with vertices and no
    faces); anything else (a suffix outside ``MESH_SUFFIXES`` too) is a ``ConfigError`` naming the file."""
    import trimesh

    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    if path.suffix.lower() not in MESH_SUFFIXES:
        raise ConfigError(f"{path}: a picture is drawn of a {', '.join(MESH_SUFFIXES)} file")
    mesh_only = path.suffix.lower() != ".ply"
    try:  # trimesh's readers fail in many ways (ValueError, KeyError, struct.error, ...) on a damaged file
        geometry = trimesh.load(path, force="mesh" if mesh_only else None, process=False)
    except Exception as exc:
        raise ConfigError(f"{path}: cannot read it as a mesh or point cloud: {type(exc).__name__}: {exc}") from None
    if isinstance(geometry, trimesh.PointCloud) and len(geometry.vertices):
        return geometry
    if isinstance(geometry, trimesh.Trimesh) and len(geometry.faces):
        return geometry
    if isinstance(geometry, trimesh.Trimesh) and mesh_only:
        raise ConfigError(f"{path}: a mesh without faces (a point cloud is read from .ply)")
    raise ConfigError(f"{path}: holds no faces and no points")


def face_colours(mesh, faces: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The colour ``[K, 3]`` (0..255) of ``mesh`` at ``points`` ``[K, 3]`` on its faces ``faces`` ``[K]``: vertex
    colours interpolated barycentrically, face colours as they are, ``GREY`` for a mesh without colours."""
    import trimesh

    visual = mesh.visual
    if visual.kind == "texture":
        visual = visual.to_color()  # the texture sampled at the vertices
    if visual.kind == "vertex":
        bary = trimesh.triangles.points_to_barycentric(mesh.triangles[faces], points)
        bary = np.nan_to_num(bary, nan=1 / 3)  # a degenerate face: its mean colour
        corners = np.asarray(visual.vertex_colors, dtype=np.float64)[mesh.faces[faces], :3]  # [K, 3, 3]
        return np.einsum("kj,kjc->kc", bary, corners)
    if visual.kind == "face":
        return np.asarray(visual.face_colors, dtype=np.float64)[faces, :3]
    return np.broadcast_to(np.asarray(GREY), (len(faces), 3))


def mesh_picture(mesh, camera: Frames, background: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Ray-cast ``mesh`` (a ``trimesh.Trimesh`` in ngp space) through every pixel centre of ``camera`` (one frame)
    -> RGB ``[H, W, 3]`` uint8 and the drawn pixels ``[H, W]`` bool (the same rays as ``mesh_silhouette``).
    ``background``: RGB 0..1 where no face is hit."""
    origins, directions = image_rays(camera, 0, torch.device("cpu"))
    o, d = origins.double().numpy(), directions.double().numpy()
    w, h = camera.image_size(0)
    first = np.asarray(mesh.ray.intersects_first(o, d), dtype=np.int64)
    hit = first >= 0
    faces, o, d = first[hit], o[hit], d[hit]
    normals = np.asarray(mesh.face_normals)[faces]
    cos = np.einsum("kc,kc->k", normals, d)
    corner = np.asarray(mesh.vertices, dtype=np.float64)[np.asarray(mesh.faces)[faces, 0]]
    safe = np.where(np.abs(cos) > 1e-12, cos, 1e-12)
    points = o + (np.einsum("kc,kc->k", normals, corner - o) / safe)[:, None] * d  # on the hit face's plane
    shade = AMBIENT + (1 - AMBIENT) * np.abs(cos)
    rgb = np.empty((h * w, 3))
    rgb[:] = np.asarray(background) * 255
    rgb[hit] = face_colours(mesh, faces, points) * shade[:, None]
    return np.clip(rgb + 0.5, 0, 255).astype(np.uint8).reshape(h, w, 3), hit.reshape(h, w)


def project(points: np.ndarray, camera: Frames) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Points ``[N, 3]`` (ngp space) through ``camera`` (one frame, its distortion and fisheye model as
    ``data.cameras.pixel_rays`` inverts them) -> continuous pixel coordinates u, v ``[N]`` (pixel centres at
    +0.5), distance from the camera ``[N]``, and whether each point is in front of it ``[N]`` bool."""
    c2w = camera.c2w[0].double()
    q = (torch.as_tensor(points, dtype=torch.float64) - c2w[:, 3]) @ c2w[:, :3]  # camera axes: right, down, forward
    z = q[:, 2]
    front = z > NEAR
    z = torch.where(front, z, torch.ones_like(z))
    x, y = q[:, 0] / z, q[:, 1] / z
    k = camera.distortion[0].double()
    if bool(camera.fisheye[0]):  # equidistant: the image radius is the (distorted) angle from the axis
        r = torch.sqrt(x * x + y * y)
        theta_d = fisheye_distort(torch.atan(r), *k[:4].unbind())
        f = torch.where(r > 1e-12, theta_d / r.clamp(min=1e-12), torch.ones_like(r))
        x, y = x * f, y * f
    elif bool((k != 0).any()):
        x, y = distort(x, y, k.expand(len(x), 6))
    fx, fy, cx, cy = camera.intrinsics[0].double().tolist()
    return (fx * x + cx).numpy(), (fy * y + cy).numpy(), q.norm(dim=1).numpy(), front.numpy()


def points_picture(
    points: np.ndarray,
    colours: np.ndarray | None,
    camera: Frames,
    background: tuple[float, float, float],
    point_px: float = 2.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Splat ``points`` ``[N, 3]`` (ngp space; ``colours`` ``[N, 3|4]`` uint8, None: ``GREY``) through ``camera``
    (one frame) -> RGB ``[H, W, 3]`` uint8 and the drawn pixels ``[H, W]`` bool. Each point is a disc ``point_px``
    pixels across: the pixel it falls in and every pixel whose centre is within ``point_px / 2`` of it; where
    discs overlap the point nearest the camera wins."""
    w, h = camera.image_size(0)
    u, v, depth, front = project(points, camera)
    keep = front & np.isfinite(u) & np.isfinite(v)
    keep &= (u > -point_px) & (u < w + point_px) & (v > -point_px) & (v < h + point_px)
    ids = np.flatnonzero(keep)
    u, v, depth = u[ids], v[ids], depth[ids]
    reach = max(0, math.ceil(point_px / 2))
    dy, dx = (a.ravel() for a in np.mgrid[-reach : reach + 1, -reach : reach + 1])
    px = np.floor(u).astype(np.int64)[:, None] + dx  # [M, K] the candidate pixels around each point
    py = np.floor(v).astype(np.int64)[:, None] + dy
    near = (px + 0.5 - u[:, None]) ** 2 + (py + 0.5 - v[:, None]) ** 2 <= (point_px / 2) ** 2
    covered = (near | ((dx == 0) & (dy == 0))) & (px >= 0) & (px < w) & (py >= 0) & (py < h)
    row, _ = np.nonzero(covered)
    pixel = py[covered] * w + px[covered]
    order = np.lexsort((depth[row], pixel))  # by pixel, nearest first
    first = np.unique(pixel[order], return_index=True)[1]
    winner, at = ids[row[order[first]]], pixel[order[first]]
    rgb = np.empty((h * w, 3))
    rgb[:] = np.asarray(background) * 255
    rgb[at] = GREY if colours is None else np.asarray(colours, dtype=np.float64)[winner, :3]
    drawn = np.zeros(h * w, dtype=bool)
    drawn[at] = True
    return np.clip(rgb + 0.5, 0, 255).astype(np.uint8).reshape(h, w, 3), drawn.reshape(h, w)
