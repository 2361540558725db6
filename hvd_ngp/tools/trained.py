"""A trained model from a snapshot, ready to render: the field (averaged weights where the snapshot holds them),
its occupancy grid, the scene it was trained on and the marching rules. Shared by the render and export tools."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cluster import dist
from ..config import merge_patch
from ..data import Scene, load_scene
from ..errors import ConfigError, SnapshotError
from ..model.encoding import FAST_RENDERER_BACKENDS, resolve_backend
from ..model.encoding.tcnn import uses_tcnn_layout
from ..model.field import NGPField, RadianceField
from ..observe.memory import MemoryBudget, ranks_on_device
from ..render.occupancy import OccupancyGrid
from ..render.regions import Partition, PiecewiseField
from ..render.volume import DEFAULT_INFERENCE
from ..state.checkpoint import (
    load_average,
    read_region,
    read_snapshot,
    restore_snapshot,
    snapshot_config,
    snapshot_layout,
)
from ..training.evaluate import BACKGROUNDS, ViewRenderer
from ..training.model_parallel import region_model
from ..training.recipe import Marching, make_grid

#: marching keys a render may change: the step along rays and where rays stop (the grid itself is trained)
RENDER_MARCHING_KEYS = ("eval_steps_per_diagonal", "cone_angle", "early_termination", "near_distance", "max_steps")


def render_marching(trained: dict, patch: dict | None, snapshot: str) -> dict:
    """The marching block to render with: ``trained`` (the snapshot's) with ``patch`` merged in; a key outside
    ``RENDER_MARCHING_KEYS`` is a ``ConfigError`` naming the snapshot."""
    if not patch:
        return trained
    bad = sorted(set(patch) - set(RENDER_MARCHING_KEYS))
    if bad:
        raise ConfigError(
            f"--marching {', '.join(bad)}: a render of {snapshot} can change only "
            f"{', '.join(RENDER_MARCHING_KEYS)} (the occupancy grid is the trained one)"
        )
    return merge_patch(trained, patch)


@dataclass
class Trained:
    """What a render of a snapshot needs. ``cfg``: the training arguments it records; ``backend``: the encoding
    backend it renders with (``fast``: with the Triton renderer)."""

    field: RadianceField  # an NGPField, or a model-parallel snapshot's regions joined (PiecewiseField)
    grid: OccupancyGrid
    scene: Scene
    march: Marching
    marching: dict
    cfg: dict
    backend: str
    budget: MemoryBudget
    device: torch.device
    step: int = 0  # the training step the snapshot was taken at

    @property
    def fast(self) -> bool:
        return self.backend in FAST_RENDERER_BACKENDS

    def background(self, name: str | None = None) -> torch.Tensor:
        """The background ``[3]`` on the device: ``name``, else the one evaluations used."""
        return torch.tensor(BACKGROUNDS[name or self.cfg.get("eval_background", "white")], device=self.device)

    def renderer(self, inference: str = DEFAULT_INFERENCE) -> ViewRenderer:
        """A ``ViewRenderer`` of the field in eval mode, within the memory budget (``inference``: its fast path)."""
        self.field.eval()
        return ViewRenderer(
            self.field,
            self.grid,
            self.march.render_schedule,
            self.march.early_termination,
            self.fast,
            self.budget,
            inference=inference,
        )


def load_trained(
    snapshot: str,
    device: str = "auto",
    scene: str | None = None,
    downscale: int | None = None,
    marching_patch: dict | None = None,
    gpu_memory_gb: float = 0.0,
) -> Trained:
    """Collective (errors agreed by every rank): start the runtime on ``device``, read ``snapshot`` and its
    scene (``scene``: another one for the cameras and test views), and build the field and grid on the device.
    A model-parallel snapshot's regions are joined into one field (``PiecewiseField``)."""
    rt = dist.init(device)
    budget = dist.agree(
        lambda: MemoryBudget.for_device(
            rt.device,
            gpu_memory_gb,
            ranks_on_device(rt.local_rank, rt.local_size, torch.cuda.device_count() if rt.device.type == "cuda" else 0),
        ),
        "planning GPU memory",
    )
    state = dist.agree(lambda: read_snapshot(snapshot, "cpu"), "reading the snapshot")
    cfg = snapshot_config(state).get("args")
    if not isinstance(cfg, dict) or "model" not in cfg:
        raise SnapshotError(f"{snapshot}: the snapshot does not record its training configuration")
    loaded = dist.agree(
        lambda: load_scene(
            scene or cfg["scene"],
            scene_cache=cfg["scene_cache"],
            builtin_seed=cfg["builtin_seed"],
            train_split=cfg["train_split"],
            test_split=cfg["test_split"],
            holdout_every=cfg["holdout_every"],
            downscale=downscale or cfg["downscale"],
            sharpness_threshold=cfg.get("sharpness_threshold", 0.0),
            mask_mode=cfg.get("mask_mode", "alpha"),
        ),
        "loading the scene",
    )
    model = cfg["model"]
    # tiny-cuda-nn keeps its own parameter layout: a snapshot trained with it renders with it
    backend = "tcnn" if uses_tcnn_layout(state["model"]) else resolve_backend("auto", rt.device)
    grid = make_grid(model["marching"], loaded)
    layout = snapshot_layout(state)
    field: NGPField | PiecewiseField
    if layout is None:
        field = NGPField(model, loaded.aabb, backend)
        restore_snapshot(state, field, grid, None, snapshot, averaged=True)
    else:  # model parallel: every region's file; each rank renders its views with all regions
        field = dist.agree(
            lambda: load_regions(snapshot, state, layout, model, backend), "reading the region files of the snapshot"
        )
        try:
            grid.load_state_dict(state["grid"])
        except RuntimeError as exc:
            raise SnapshotError(
                f"{snapshot}: the occupancy grid does not match the config: {str(exc).splitlines()[0]}"
            ) from None
        dist.log(f"model-parallel snapshot: {layout['model_parallel']} regions ({field.partition.describe()})")
    marching = render_marching(model["marching"], marching_patch, snapshot)
    march = Marching.from_config(
        marching, loaded.aabb_scale, "--marching" if marching_patch else f"{snapshot}: the trained config"
    )
    return Trained(
        field.to(rt.device),
        grid.to(rt.device),
        loaded,
        march,
        marching,
        cfg,
        backend,
        budget,
        rt.device,
        int(state.get("step", 0)),
    )


def load_regions(path: str, state: dict, layout: dict, model: dict, backend: str) -> PiecewiseField:
    """The K region fields of a model-parallel snapshot (averaged weights where it holds them) as one field."""
    partition = Partition.from_json(layout["partition"])
    k = int(layout["model_parallel"])
    fields = []
    for region in range(k):
        part = read_region(path, layout, region)
        f = NGPField(region_model(model, k), partition.boxes[region], backend)
        try:
            f.load_state_dict(part["model"])
        except RuntimeError as exc:
            raise SnapshotError(
                f"{path}: region {region} does not match its config: {str(exc).splitlines()[0]}"
            ) from None
        load_average(f, part.get("ema") or {})
        fields.append(f)
    return PiecewiseField(fields, partition)
