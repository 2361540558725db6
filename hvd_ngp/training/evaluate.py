"""Test-view evaluation: PSNR and SSIM over a split, rendered rank-parallel; rank 0 writes PNGs.

Two protocols. ``std``, the NeRF-synthetic standard: one ray per pixel centre, render and reference
composited on ``--eval_background`` in sRGB values. ``ngp``, instant-ngp's ``scripts/run.py``
(commit abe236e): an opaque black background, ``NGP_SPP`` renders through the pixel centres
(``snap_to_pixel_centers``) that differ in their step offset along the rays (its fused render
kernel offsets each sample index), averaged in linear light and encoded back to sRGB; the reference
is composited on black in linear light (``lin(c) * alpha``); both clipped to [0, 1].
"""

from __future__ import annotations

import operator
import time
from functools import reduce
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..cluster import dist, preempt
from ..data import Frames
from ..data.sampler import image_pixels, image_rays
from ..errors import OutputError, os_cause
from ..model.field import RadianceField
from ..observe.memory import DEFAULT_ROW_BYTES, MemoryBudget, bytes_per_row
from ..observe.metrics import linear_to_srgb, mse_to_psnr, srgb_to_linear, ssim
from ..observe.progress import progress
from ..render import StepSchedule, composite_background, max_lanes, render_image
from ..render.occupancy import OccupancyGrid
from ..render.outputs import render_outputs
from ..render.plan import plan_render, reference_chunk
from ..render.volume import DEFAULT_INFERENCE

BACKGROUNDS = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}
NGP_SPP = 8  # instant-ngp's scripts/run.py


class ViewRenderer:
    """Renders whole views of ``field`` without gradients within a memory ``budget`` (None: default
    chunks): the bytes per network row are measured and the plan and workspace made once, then
    reused by every view (``fast``: the Triton kernels, through ``inference``: one of
    ``render.volume.INFERENCE_PATHS``)."""

    def __init__(
        self,
        field: RadianceField,
        grid: OccupancyGrid,
        schedule: StepSchedule,
        early_termination: float,
        fast: bool = False,
        budget: MemoryBudget | None = None,
        parallel=None,
        inference: str = DEFAULT_INFERENCE,
    ) -> None:
        """``parallel``: a ``model_parallel.ModelParallel``; views then render through its segment exchange
        (the reference renderer, chunks agreed by all ranks: collective)."""
        self.field, self.grid, self.schedule, self.early_termination = field, grid, schedule, early_termination
        self.fast, self.budget, self.parallel, self.inference = fast, budget, parallel, inference
        device = field.aabb.device
        self.row_bytes = bytes_per_row(self._probe, 1 << 16, device, DEFAULT_ROW_BYTES)
        self.workspace = None
        if parallel is not None:
            self.fast = False
            chunk = reference_chunk(
                budget.available() if budget is not None else None,
                max_lanes(schedule, parallel.partition.aabb),
                self.row_bytes,
            )
            self.chunk = int(dist.allreduce(torch.tensor([chunk]), "min", name="eval.chunk")[0])
            return
        if fast:
            from ..render.fast import RenderWorkspace, inference_costs

            available = budget.available() if budget is not None else None
            plan = plan_render(available, inference_costs(schedule, self.row_bytes), max_lanes(schedule, field.aabb))
            self.workspace = RenderWorkspace(plan, device)

    def _probe(self, n: int) -> None:
        """The field's colour query on ``n`` points, as a render calls it (for ``bytes_per_row``)."""
        lo, hi = self.field.aabb[0], self.field.aabb[1]
        gen = torch.Generator(device=lo.device).manual_seed(0)
        x = lo + torch.rand((n, 3), generator=gen, device=lo.device) * (hi - lo)
        d = torch.nn.functional.normalize(torch.randn((n, 3), generator=gen, device=lo.device), dim=-1)
        with torch.no_grad():
            self.field(x, d)

    def view(self, frames: Frames, index: int, background: Tensor, step_offset: float = 0.5) -> Tensor:
        """One image of ``frames`` over ``background`` ``[3]`` -> ``[H, W, 3]`` in [0, 1] (``step_offset``:
        see ``render.render_image``)."""
        o, d = image_rays(frames, index, background.device)
        field = self.field
        if self.parallel is not None:
            rgb, _ = self.parallel.render_image(
                field, o, d, self.grid, self.schedule, background, self.early_termination, self.chunk, step_offset
            )
            w, h = frames.image_size(index)
            return rgb.clamp(0, 1).view(h, w, 3)
        rgb, _ = render_image(
            field,
            field.density,
            o,
            d,
            field.aabb,
            self.grid,
            self.schedule,
            background,
            self.early_termination,
            fast=self.fast,
            budget=self.budget,
            workspace=self.workspace,
            row_bytes=self.row_bytes,
            step_offset=step_offset,
            between_chunks=preempt.interruption_point,
            inference=self.inference,
        )
        w, h = frames.image_size(index)
        return rgb.clamp(0, 1).view(h, w, 3)

    def outputs(self, frames: Frames, index: int, background: Tensor, normals: bool = False) -> dict[str, Tensor]:
        """One view's ``render.outputs`` buffers: "rgb" ``[H, W, 3]`` over ``background``, "opacity" and "depth"
        ``[H, W]``, with ``normals`` "normal" ``[H, W, 3]`` (the reference renderer then, in quarter chunks: six
        more density queries per sample; the central differences half the finest step apart)."""
        if self.parallel is not None:
            raise ValueError("per-pixel outputs of a model-parallel render are not supported")
        o, d = image_rays(frames, index, background.device)
        field = self.field
        if self.workspace is not None and not normals:
            chunk = self.workspace.plan.rays
        else:
            available = self.budget.available() if self.budget is not None else None
            chunk = reference_chunk(available, max_lanes(self.schedule, field.aabb), self.row_bytes)
            chunk = max(1, chunk // 4) if normals else chunk
        out = render_outputs(
            field,
            field.density,
            o,
            d,
            field.aabb,
            self.grid,
            self.schedule,
            self.early_termination,
            background,
            chunk,
            0.5 * self.schedule.dt_min if normals else 0.0,
            fast=self.fast and not normals,
            workspace=self.workspace,
            inference=self.inference,
        )
        w, h = frames.image_size(index)
        return {k: v.view(h, w, *v.shape[1:]) for k, v in out.items()}

    def view_ngp(self, frames: Frames, index: int, spp: int = NGP_SPP) -> Tensor:
        """The ``ngp`` protocol's render of one view ``[H, W, 3]``: ``spp`` renders on black with step offsets
        ``(k + 0.5) / spp``, averaged in linear light, back to sRGB (spp 1: ``view`` on black)."""
        black = torch.zeros(3, device=self.field.aabb.device)
        linear = reduce(
            operator.add, (srgb_to_linear(self.view(frames, index, black, (k + 0.5) / spp)) for k in range(spp))
        )
        return linear_to_srgb(linear / spp).clamp(0, 1)


def reference_view(frames: Frames, index: int, protocol: str, background: Tensor) -> Tensor:
    """The reference pixels of one view ``[H*W, 3]`` under ``protocol`` (``background`` ``[3]``: std's)."""
    rgba = image_pixels(frames, index).to(background.device).float() / 255.0
    if protocol == "ngp":
        return linear_to_srgb(srgb_to_linear(rgba[:, :3]) * rgba[:, 3:4]).clamp(0, 1)
    return composite_background(rgba, background)


def to_uint8(img: Tensor) -> np.ndarray:
    return (img * 255 + 0.5).byte().cpu().numpy()


def write_png(path: Path, rgb: np.ndarray) -> None:
    import cv2

    ok, encoded = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    try:  # cv2.imwrite returns False on a failed write and says nothing
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encoded.tobytes())
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the render: {os_cause(exc)}") from None


def view_mse(img: Tensor, gt: Tensor, keep: Tensor | None) -> float:
    """Mean squared error of a render ``[H, W, 3]`` against its reference over the pixels that count: ``keep``
    ``[H_max, W_max]`` bool (the frame's mask, padded; None, or a view masked out entirely: every pixel)."""
    err = ((img - gt) ** 2).mean(dim=-1)
    if keep is not None:
        keep = keep[: img.shape[0], : img.shape[1]].to(err.device)
        if bool(keep.any()):
            return float(err[keep].mean())
    return float(err.mean())


def timed_view(renderer: ViewRenderer, frames: Frames, i: int, protocol: str, bg: Tensor) -> tuple[Tensor, float]:
    """View ``i`` rendered under ``protocol`` ``[H, W, 3]`` and its wall time in seconds (device synchronised)."""
    t0 = time.perf_counter()
    img = renderer.view_ngp(frames, i) if protocol == "ngp" else renderer.view(frames, i, bg)
    if img.is_cuda:
        torch.cuda.synchronize(img.device)
    return img, time.perf_counter() - t0


def write_gathered(renders: list[tuple[int, np.ndarray]], save_dir: Path | None) -> None:
    """Collective: every rank's (view index, uint8 image) renders gathered; rank 0 writes them to ``save_dir``."""
    gathered = dist.allgather_object(renders, name="eval.images")
    if dist.runtime().is_root and save_dir is not None:
        for per_rank in gathered:
            for i, img in per_rank:
                write_png(save_dir / f"test_{i:03d}.png", img)


def stop_voted(mine: bool) -> bool:
    """Collective (one tiny allreduce): does any rank want to stop?"""
    return float(dist.allreduce(torch.tensor([float(mine)]), "max", name="eval.stop")[0]) > 0


def evaluate(
    field: RadianceField,
    grid: OccupancyGrid,
    frames: Frames,
    schedule: StepSchedule,
    early_termination: float,
    background: str,
    n_views: int = 0,
    save_dir: Path | None = None,
    n_save: int = 0,
    writer: str = "root",
    fast: bool = False,
    protocol: str = "std",
    budget: MemoryBudget | None = None,
    parallel=None,
    stops: preempt.StopSignals | None = None,
    inference: str = DEFAULT_INFERENCE,
) -> dict:
    """PSNR (mean over views; over each view's kept pixels, ``Frames.keep``) and SSIM (whole views) over the first
    ``n_views`` views (0: all) under ``protocol`` (see the module docstring; ``ngp`` ignores ``background``).
    Collective: every rank renders views ``rank, rank + size, ...``; per-view errors are summed with one allreduce.

    The first ``n_save`` renders go to ``save_dir`` as PNG: gathered and written by rank 0
    (``writer="root"``, the trainer's rule), or written by the rank that rendered them
    (``writer="each_rank"``, for the render tool on a shared filesystem). Views are rendered within
    ``budget`` (see ``ViewRenderer``). Model parallel (``parallel``): replica d's K ranks render views
    ``d, d + D, ...`` together, and its region-0 rank reports them.

    ``stops``: the run's stop handlers. Then a stop request cuts this rank's view short between two chunks
    (not under model parallelism, whose chunks exchange segments), the ranks vote after each round of views
    (one tiny allreduce), and on a stop every rank returns ``{"stopped": True, ...}`` at once.

    ``inference``: the fast renderer's path (``ViewRenderer``). The result's ``seconds_per_view``: the mean wall
    time of one view's render (device synchronised), over the views; ``seconds_per_view_after_first``: the same
    without view 0 (which pays the process's first-render costs). Rank 0 shows a progress bar over its views
    (``observe.progress``: at once on a terminal, else after 5 s)."""
    rt = dist.runtime()
    n = len(frames) if n_views <= 0 else min(n_views, len(frames))
    if n == 0:
        return {"psnr": float("nan"), "ssim": float("nan"), "views": 0, "seconds_per_view": float("nan")}
    bg = torch.tensor(BACKGROUNDS[background], device=rt.device)
    scores = torch.zeros(n, 3, dtype=torch.float64)  # mse, ssim, render seconds
    keep: list[tuple[int, np.ndarray]] = []
    was_training = field.training
    field.eval()
    renderer = ViewRenderer(field, grid, schedule, early_termination, fast, budget, parallel, inference)
    first, step = (rt.rank, rt.size) if parallel is None else parallel.view_share()
    interrupted = False
    rounds = range(first, first + step * -(-n // step), step)  # the same number of rounds on every rank
    for i in progress(rounds, "test views", "view", rt.is_root):
        if i < n and not interrupted:
            try:
                with preempt.interruptible(stops if parallel is None else None):
                    img, seconds = timed_view(renderer, frames, i, protocol, bg)
            except preempt.Interrupted:
                interrupted = True
            else:
                if parallel is None or parallel.reports:
                    scores[i, 2] = seconds
                    gt = reference_view(frames, i, protocol, bg).view_as(img)
                    scores[i, 0] = view_mse(img, gt, None if frames.keep is None else frames.keep[i])
                    scores[i, 1] = ssim(img, gt)
                    if i < n_save:
                        keep.append((i, to_uint8(img)))
                        if writer == "each_rank" and save_dir is not None:
                            write_png(save_dir / f"test_{i:03d}.png", keep.pop()[1])
        if stops is not None and stop_voted(interrupted or stops.pending()):
            field.train(was_training)
            return {"psnr": float("nan"), "ssim": float("nan"), "views": 0, "stopped": True}
    field.train(was_training)
    scores = dist.allreduce(scores, "sum", name="eval.scores")
    if n_save > 0 and writer == "root":
        write_gathered(keep, save_dir)
    return evaluation_summary(scores)


def evaluation_summary(scores: Tensor) -> dict:
    """Per-view (mse, ssim, render seconds) ``[n, 3]``, summed over the ranks -> ``evaluate``'s result."""
    psnrs = [mse_to_psnr(float(m)) for m in scores[:, 0]]
    n = scores.shape[0]
    return {
        "psnr": float(np.mean(psnrs)),
        "ssim": float(scores[:, 1].mean()),
        "views": n,
        "seconds_per_view": float(scores[:, 2].mean()),
        "seconds_per_view_after_first": float(scores[1:, 2].mean()) if n > 1 else float(scores[0, 2]),
        "psnr_per_view": [round(p, 3) for p in psnrs],
    }
