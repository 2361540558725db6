"""Marching-cubes meshes of a trained density field, coloured as instant-ngp colours them.

The density is sampled on a lattice over a box (by default the occupied cells of the occupancy grid), zero in
cells the grid marks free (the renderer skips them too), and the ``threshold`` iso-surface is extracted with
PyMCubes. Each vertex is coloured by the colour network looking at it from outside: along ``-n``, with ``n`` the
outward normal ``-grad sigma`` (``render.volume.density_normals``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ..errors import HvdNgpError
from ..render.occupancy import OccupancyGrid
from ..render.volume import density_normals

#: instant-ngp's defaults for "Mesh it!" / --save_mesh: 256 cells along the longest side, density 2.5
DEFAULT_RESOLUTION = 256
DEFAULT_THRESHOLD = 2.5
#: the mesh files written (``hvd-ngp-export mesh --out``) and read back (``picture``, ``iou --mesh``), through trimesh
MESH_SUFFIXES = (".ply", ".obj", ".glb")
CHUNK = 1 << 18


def occupied_box(grid: OccupancyGrid, aabb: Tensor) -> Tensor:
    """The bounding box ``[2, 3]`` of the grid's occupied cells (every cascade), inside ``aabb``; ``aabb`` when
    nothing is occupied."""
    cells = torch.nonzero(grid.occupied.view(-1)).squeeze(1)
    if cells.numel() == 0:
        return aabb.clone()
    lo = grid.cell_positions(cells, torch.zeros(cells.numel(), 3, device=cells.device)).min(0).values
    hi = grid.cell_positions(cells, torch.ones(cells.numel(), 3, device=cells.device)).max(0).values
    return torch.stack([torch.maximum(lo, aabb[0]), torch.minimum(hi, aabb[1])])


def lattice_shape(box: Tensor, resolution: int) -> tuple[int, int, int]:
    """Points along each axis: ``resolution`` along the box's longest side, cubic cells."""
    ext = (box[1] - box[0]).tolist()
    cell = max(ext) / (resolution - 1)
    nx, ny, nz = (max(2, int(math.ceil(e / cell)) + 1) for e in ext)
    return nx, ny, nz


@torch.no_grad()
def density_lattice(sigma_fn, grid: OccupancyGrid | None, box: Tensor, shape: tuple[int, int, int]) -> np.ndarray:
    """The density at the lattice points ``shape`` spanning ``box`` (corners included) -> float32 ``shape``,
    zero where ``grid`` marks the cell free."""
    axes = [torch.linspace(float(box[0, i]), float(box[1, i]), shape[i], device=box.device) for i in range(3)]
    out = torch.empty(shape[0] * shape[1] * shape[2], device=box.device)
    plane = shape[1] * shape[2]
    yz = torch.stack(torch.meshgrid(axes[1], axes[2], indexing="ij"), -1).view(-1, 2)
    for i in range(shape[0]):
        x = torch.cat([axes[0][i].expand(plane, 1), yz], 1)
        for s in range(0, plane, CHUNK):
            sigma = sigma_fn(x[s : s + CHUNK]).float()
            if grid is not None:
                sigma = torch.where(grid.is_occupied(x[s : s + CHUNK]), sigma, 0.0)
            out[i * plane + s : i * plane + s + sigma.shape[0]] = sigma
    return out.view(shape).cpu().numpy()


@torch.no_grad()
def vertex_colours(field, vertices: Tensor, normal_step: float) -> tuple[np.ndarray, np.ndarray]:
    """Outward unit normals ``[V, 3]`` and uint8 RGB colours ``[V, 3]`` of the field's colour network at
    ``vertices`` ``[V, 3]`` looking along ``-normal``."""
    normals, colours = [], []
    for s in range(0, vertices.shape[0], CHUNK):
        v = vertices[s : s + CHUNK]
        n = density_normals(field.density, v, normal_step)
        d = torch.where(n.norm(dim=-1, keepdim=True) > 0.5, -n, torch.tensor([0.0, 0.0, 1.0], device=v.device))
        rgb, _ = field(v, d)
        normals.append(n.cpu())
        colours.append((rgb.float().clamp(0, 1) * 255 + 0.5).byte().cpu())
    if not normals:
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8)
    return torch.cat(normals).numpy(), torch.cat(colours).numpy()


def extract_mesh(
    field,
    grid: OccupancyGrid | None,
    resolution: int = DEFAULT_RESOLUTION,
    threshold: float = DEFAULT_THRESHOLD,
    box: Tensor | None = None,
):
    """The ``threshold`` iso-surface of ``field``'s density as a ``trimesh.Trimesh`` in ngp space, faces wound
    outward, with vertex colours (see the module docstring). ``box`` ``[2, 3]``: where to sample (default: the
    occupied cells' bounding box). ``HvdNgpError`` when nothing in the box is denser than ``threshold``."""
    import mcubes
    import trimesh

    aabb = field.aabb
    box = occupied_box(grid, aabb) if box is None and grid is not None else (aabb if box is None else box.to(aabb))
    shape = lattice_shape(box, resolution)
    sigma = density_lattice(field.density, grid, box, shape)
    if not (sigma > threshold).any():
        raise HvdNgpError(
            f"no density above the threshold {threshold} in the box {box.tolist()} "
            f"(the largest is {float(sigma.max()):.3g}): lower --threshold"
        )
    verts, faces = mcubes.marching_cubes(sigma, threshold)
    step = (box[1] - box[0]).cpu().double().numpy() / (np.asarray(shape) - 1)
    verts = box[0].cpu().double().numpy() + verts * step
    mesh = trimesh.Trimesh(verts, faces.astype(np.int64), process=False)
    v = torch.tensor(mesh.vertices, dtype=torch.float32, device=aabb.device)
    normals, colours = vertex_colours(field, v, 0.5 * float(step.min()))
    if len(mesh.faces) and float((mesh.vertex_normals * normals).sum()) < 0:  # wind the faces outward
        mesh.invert()
    assert isinstance(mesh.visual, trimesh.visual.ColorVisuals)  # a mesh made without a texture
    mesh.visual.vertex_colors = np.concatenate([colours, np.full((len(colours), 1), 255, np.uint8)], 1)
    return mesh
