"""Rendering: the occupancy grid, the step schedule, marching and compositing (each Triton kernel in the
``*_triton`` file beside its torch twin), chunked image rendering and the fast GPU renderer.

The package face only re-exports; the code lives in ``schedule`` (sample spacing along a ray),
``volume`` (reference marching, transmittance, compositing, chunked images), ``occupancy``,
``fast`` (the Triton path), ``regions`` (the scene split into model-parallel boxes) and ``camera_path``. The renderer meets the field only through the
``sigma_fn`` / ``rgb_sigma_fn`` callbacks.
"""

from .occupancy import OccupancyGrid
from .schedule import MarchLaunch, StepSchedule
from .volume import (REFERENCE_LANE_BYTES, REFERENCE_MAX_CHUNK, RenderResult, RGBSigmaFn, Samples, SigmaFn, accumulate,
                     march, max_lanes, reference_chunk, render_image, render_rays, transmittance_weights)

__all__ = ["MarchLaunch", "OccupancyGrid", "REFERENCE_LANE_BYTES", "REFERENCE_MAX_CHUNK", "RGBSigmaFn", "RenderResult",
           "Samples", "SigmaFn", "StepSchedule", "accumulate", "march", "max_lanes", "reference_chunk", "render_image",
           "render_rays", "transmittance_weights"]
