"""Rendering: the occupancy grid, the step schedule, marching and compositing (each Triton kernel in the
``*_triton`` file beside its torch twin), chunked image rendering and the fast GPU renderer.

The package face only re-exports; the code lives in ``schedule`` (sample spacing along a ray),
``geometry`` (rays against boxes), ``volume`` (reference marching, transmittance, compositing, background,
chunked images), ``occupancy``, ``plan`` (chunk and workspace sizes from the memory left), ``fast`` (the
Triton path), ``regions`` (the scene split into model-parallel boxes) and ``camera_path``.

Like nerfacc, everything here is a function of tensors and callbacks: the field is reached only through the
``sigma_fn`` / ``rgb_sigma_fn`` callbacks, and no collective runs here (the grid update takes this rank's
share and a reduction from its caller, ``training.grid_sync``), so render imports neither ``cluster`` nor
``data`` (setup.cfg's contracts).
"""

from .geometry import intersect_aabb
from .occupancy import OccupancyGrid
from .plan import REFERENCE_LANE_BYTES, REFERENCE_MAX_CHUNK, RenderCosts, RenderPlan, plan_render, reference_chunk
from .schedule import MarchLaunch, StepSchedule
from .volume import (
    RenderResult,
    RGBSigmaFn,
    Samples,
    SigmaFn,
    accumulate,
    composite_background,
    march,
    max_lanes,
    over_background,
    render_image,
    render_rays,
    transmittance_weights,
)

__all__ = [
    "MarchLaunch",
    "OccupancyGrid",
    "REFERENCE_LANE_BYTES",
    "REFERENCE_MAX_CHUNK",
    "RGBSigmaFn",
    "RenderCosts",
    "RenderPlan",
    "RenderResult",
    "Samples",
    "SigmaFn",
    "StepSchedule",
    "accumulate",
    "composite_background",
    "intersect_aabb",
    "march",
    "max_lanes",
    "over_background",
    "plan_render",
    "reference_chunk",
    "render_image",
    "render_rays",
    "transmittance_weights",
]
