"""Point clouds of a trained field: one point per kept pixel of the training views, at the ray's expected
termination (``render.outputs``' depth), coloured by the rendered colour, kept where the opacity exceeds a cut."""

from __future__ import annotations

import numpy as np
import torch

from ..data import Frames
from ..data.sampler import image_rays
from ..training.evaluate import ViewRenderer

#: pixels whose opacity is below this are left out (half-transparent edges and floaters)
DEFAULT_OPACITY_CUT = 0.9
DEFAULT_MAX_POINTS = 1_000_000


@torch.no_grad()
def point_cloud(
    renderer: ViewRenderer,
    frames: Frames,
    background: torch.Tensor,
    opacity_cut: float = DEFAULT_OPACITY_CUT,
    max_points: int = DEFAULT_MAX_POINTS,
    seed: int = 0,
    progress=None,
    n_views: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Points ``[N, 3]`` (ngp space, float32) and uint8 RGB colours ``[N, 3]`` from the first ``n_views`` views of
    ``frames`` (0: all): at most about ``max_points`` in all (each view keeps the same random share of its pixels,
    ``seed``). ``progress``: wraps the view indices (a tqdm, or None)."""
    views = range(len(frames) if n_views <= 0 else min(n_views, len(frames)))
    sizes = frames.sizes
    assert sizes is not None  # Frames.__post_init__ fills it
    n_pixels = int(sum(w * h for w, h in sizes[: len(views)].tolist()))
    share = min(1.0, max_points / max(n_pixels, 1))
    gen = torch.Generator().manual_seed(seed)
    points, colours = [], []
    for i in progress(views) if progress is not None else views:
        out = renderer.outputs(frames, i, background)
        opacity = out["opacity"].reshape(-1)
        pick = torch.rand(opacity.shape[0], generator=gen) < share
        keep = (opacity.cpu() > opacity_cut) & pick
        if not bool(keep.any()):
            continue
        keep = keep.to(opacity.device)
        o, d = image_rays(frames, i, background.device)
        a = opacity[keep][:, None]
        rgb = (out["rgb"].reshape(-1, 3)[keep] - background * (1 - a)) / a  # un-composite: the surface's own colour
        points.append((o[keep] + d[keep] * out["depth"].reshape(-1)[keep][:, None]).float().cpu())
        colours.append((rgb.clamp(0, 1) * 255 + 0.5).byte().cpu())
    if not points:
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8)
    return torch.cat(points).numpy(), torch.cat(colours).numpy()
