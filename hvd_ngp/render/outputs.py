"""A view's per-pixel outputs besides colour, and how they are drawn as PNGs.

- ``rgb``: the colour over the background.
- ``opacity``: the sum of the volume-rendering weights, in [0, 1]. PNG: grey, white = opaque.
- ``depth``: the expected termination distance, ``sum(w t) / opacity``: the distance from the camera centre
  along the (unit) ray in ngp-space units (not the z-depth); 0 where nothing is hit. PNG: the turbo colour map
  from ``near`` (blue) to ``far`` (red), faded into the background by the opacity.
- ``normal``: the samples' outward unit normals (``volume.density_normals``: minus the density gradient) summed
  with the weights and normalised, in ngp-space axes. PNG: ``(n + 1) / 2`` as RGB (x red, y green, z blue),
  faded into the background by the opacity.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .occupancy import OccupancyGrid
from .schedule import StepSchedule
from .volume import (
    DEFAULT_INFERENCE,
    RGBSigmaFn,
    SigmaFn,
    inference_path,
    inference_scope,
    over_background,
    render_rays,
)

OUTPUTS = ("rgb", "depth", "normal", "opacity")


def parse_outputs(text: str) -> tuple[str, ...]:
    """``"rgb,depth"`` -> ('rgb', 'depth'); ValueError naming an unknown output."""
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [n for n in names if n not in OUTPUTS]
    if bad or not names:
        raise ValueError(f"unknown output {', '.join(bad) or '(none)'}: choose among {', '.join(OUTPUTS)}")
    return names


def render_outputs(
    rgb_sigma_fn: RGBSigmaFn,
    sigma_fn: SigmaFn,
    origins: Tensor,
    directions: Tensor,
    aabb: Tensor,
    grid: OccupancyGrid | None,
    schedule: StepSchedule,
    early_termination: float,
    background: Tensor,
    chunk: int,
    normal_step: float = 0.0,
    fast: bool = False,
    workspace=None,
    inference: str = DEFAULT_INFERENCE,
) -> dict[str, Tensor]:
    """Rays ``[R, 3]`` rendered ``chunk`` at a time without gradients -> {"rgb" ``[R, 3]`` over ``background``,
    "opacity" ``[R]``, "depth" ``[R]`` (see the module docstring), and with ``normal_step`` > 0 "normal" ``[R, 3]``
    (unit, zero where nothing is hit; central differences ``normal_step`` apart)}. ``fast``: the Triton renderer
    (``inference``: ``volume.INFERENCE_PATHS``, in ``workspace``) for rgb, opacity and depth; normals take the reference
    renderer."""
    parts: dict[str, list[Tensor]] = {"rgb": [], "opacity": [], "depth": [], "normal": []}
    with torch.no_grad(), inference_scope():
        for s in range(0, origins.shape[0], chunk):
            o, d = origins[s : s + chunk], directions[s : s + chunk]
            if fast and normal_step <= 0:
                rgb, opacity, depth = inference_path(inference)(
                    rgb_sigma_fn, sigma_fn, o, d, aabb, grid, schedule, early_termination, workspace
                )
            else:
                out = render_rays(
                    rgb_sigma_fn, sigma_fn, o, d, aabb, grid, schedule, early_termination, normal_step=normal_step
                )
                rgb, opacity, depth = out.rgb, out.opacity, out.depth
                if out.normal is not None:
                    n = out.normal.float()
                    parts["normal"].append(n / n.norm(dim=-1, keepdim=True).clamp(min=1e-12))
            opacity = opacity.float()
            parts["rgb"].append(over_background(rgb, opacity, background))
            parts["opacity"].append(opacity)
            parts["depth"].append(torch.where(opacity > 1e-6, depth.float() / opacity.clamp(min=1e-6), 0.0))
    return {k: torch.cat(v) for k, v in parts.items() if v}


def depth_range(depth: Tensor, opacity: Tensor, cut: float = 0.5) -> tuple[float, float] | None:
    """(near, far): the 1st and 99th percentiles of ``depth`` where ``opacity`` > ``cut`` (any shape); None when
    nothing is that opaque."""
    d = depth[opacity > cut].float()
    if d.numel() == 0:
        return None
    if d.numel() > 1 << 20:
        d = d[torch.randperm(d.numel(), generator=torch.Generator().manual_seed(0))[: 1 << 20].to(d.device)]
    q = torch.quantile(d, torch.tensor([0.01, 0.99], device=d.device))
    near, far = float(q[0]), float(q[1])
    return near, max(far, near + 1e-6)


def _fade(colour: np.ndarray, opacity: np.ndarray, background) -> np.ndarray:
    """colour ``[H, W, 3]`` in [0, 1] over ``background`` by ``opacity`` ``[H, W]`` -> uint8 RGB."""
    a = np.clip(opacity, 0, 1)[..., None]
    out = colour * a + np.asarray(background, dtype=np.float64) * (1 - a)
    return (np.clip(out, 0, 1) * 255 + 0.5).astype(np.uint8)


def colorize_depth(depth: np.ndarray, opacity: np.ndarray, near: float, far: float, background) -> np.ndarray:
    """Depth ``[H, W]`` -> uint8 RGB ``[H, W, 3]``: turbo from ``near`` (blue) to ``far`` (red), faded into
    ``background`` (3 values in [0, 1]) by ``opacity``."""
    import cv2

    u = np.clip((depth - near) / (far - near), 0, 1)
    bgr = cv2.applyColorMap((u * 255 + 0.5).astype(np.uint8), cv2.COLORMAP_TURBO)
    return _fade(bgr[..., ::-1].astype(np.float64) / 255, opacity, background)


def colorize_normal(normal: np.ndarray, opacity: np.ndarray, background) -> np.ndarray:
    """Unit normals ``[H, W, 3]`` -> uint8 RGB ``(n + 1) / 2``, faded into ``background`` by ``opacity``."""
    return _fade((normal + 1) / 2, opacity, background)


def colorize_opacity(opacity: np.ndarray) -> np.ndarray:
    """Opacity ``[H, W]`` -> uint8 grey RGB (white opaque)."""
    g = (np.clip(opacity, 0, 1) * 255 + 0.5).astype(np.uint8)
    return np.repeat(g[..., None], 3, axis=2)
