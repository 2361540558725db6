"""Typed settings: the trainer's options as frozen dataclasses, one per concern.

``config.parse_settings`` parses the command line, the ``HVD_NGP_*`` environment and the config file
(in that precedence) once, validates the flags, and fills ``Settings`` here; after that no part of the
trainer reads a Namespace. Each part receives only its own group: the scene loader ``SceneSettings``,
the builder ``ModelSettings`` and ``RuntimeSettings``, the step ``StepSettings``, the run loop
``LoopSettings``, ``EvalSettings`` and ``OutputSettings``; the data pipeline, the communication knobs
and the monitor keep the settings classes of their own packages (``DataSettings``, ``CommSettings``,
``MonitorSettings``), validated in the same place. Values that today's options leave open and that
follow from others (``--n_steps`` with a time budget, the stop signals' names) are derived once, in
``Settings.from_namespace``.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .cluster.comm import CommSettings
from .data.pipeline import DataSettings
from .observe.monitor import MonitorSettings


@dataclass(frozen=True)
class SceneSettings:
    """Which scene and how it is loaded (``data.load_scene``'s arguments)."""

    TITLE: ClassVar[str] = "scene"  # its --help group

    scene: str
    scene_cache: str
    builtin_seed: int
    train_split: str
    test_split: str
    holdout_every: int
    downscale: int
    sharpness_threshold: float
    mask_mode: str  # what nerfstudio's mask_path does: alpha | exclude

    def load_kwargs(self) -> dict:
        """``load_scene``'s keyword arguments other than the scene itself."""
        return {
            "scene_cache": self.scene_cache,
            "builtin_seed": self.builtin_seed,
            "train_split": self.train_split,
            "test_split": self.test_split,
            "holdout_every": self.holdout_every,
            "downscale": self.downscale,
            "sharpness_threshold": self.sharpness_threshold,
            "mask_mode": self.mask_mode,
        }


@dataclass(frozen=True)
class ModelSettings:
    """The merged network blocks (``blocks``: encoding, network, ..., marching, optimizer, loss,
    distributed and ``_source``, the config file they came from), the compute path and precision flags."""

    TITLE: ClassVar[str] = "model: compute path and precision (the network blocks: see below)"  # its --help group

    blocks: dict
    backend: str
    precision: str  # the flag; the trainer resolves "auto" against its device (``recipe.resolve_precision``)
    config: str | None  # the --config file (resolved path), None when none was named

    @property
    def source(self) -> str:
        return self.blocks["_source"]


@dataclass(frozen=True)
class RuntimeSettings:
    """Where and how this rank runs: device, threads, memory, the communication knobs and Horovod's tools."""

    TITLE: ClassVar[str] = (
        "runtime: device, threads, memory (communication and Horovod's tools: the next two groups)"  # its --help group
    )

    device: str
    threads: int
    gpu_memory_gb: float
    comm: CommSettings
    timeline: str | None
    timeline_mark_cycles: bool
    autotune: bool
    autotune_log: str | None
    stall_check_s: float | None
    stall_shutdown_s: float | None


@dataclass(frozen=True)
class StepSettings:
    """One training step: its ray and sample counts, random streams, background and graphed-step modes."""

    TITLE: ClassVar[str] = "training step: rays, samples, seed, background, CUDA graphs"  # its --help group

    target_samples: int
    sample_fill: float
    n_rays_init: int
    max_rays: int
    seed: int
    train_background: str
    cuda_graphs: str
    graph_grid_update: str
    draw_ahead: str
    defer_verdict: str


@dataclass(frozen=True)
class LoopSettings:
    """The run loop's schedule: length, time budget, log interval, safeguards and stop signals."""

    TITLE: ClassVar[str] = "run loop: length, time budget, log interval, safeguards, stop signals"  # its --help group

    n_steps: int  # derived: --n_steps, else unlimited under --time_budget_s alone, else DEFAULT_STEPS
    time_budget_s: float
    budget_lr_decay: str
    log_every: int
    watchdog_s: float
    nonfinite_limit: int
    commit_every: int
    stop_signals: tuple[str, ...]  # derived: --stop_signals parsed ("TERM", ...; () for none)


@dataclass(frozen=True)
class EvalSettings:
    """Test-view evaluations: when (steps, seconds), on how many views, against which background."""

    TITLE: ClassVar[str] = "evaluation"  # its --help group

    eval_every: int
    eval_at_s: tuple[float, ...]
    eval_at_steps: tuple[int, ...]
    n_eval_views: int
    save_renders: int
    eval_background: str
    eval_protocol: str


@dataclass(frozen=True)
class OutputSettings:
    """What the run writes and reads back: output folder, metrics, snapshots, checkpoints, resume."""

    TITLE: ClassVar[str] = "outputs, snapshots, checkpoints and resume"  # its --help group

    out_dir: str
    metrics_json: str | None
    save_snapshot: str | None
    load_snapshot: str | None
    ckpt_dir: str | None
    ckpt_every: int
    ckpt_every_minutes: float
    ckpt_keep: int
    resume: str | None
    allow_resume_changes: bool

    @property
    def checkpointing(self) -> bool:
        """Periodic checkpoints are on (then a run also ends, or stops on its time budget, with one)."""
        return self.ckpt_every > 0 or self.ckpt_every_minutes > 0

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.ckpt_dir) if self.ckpt_dir else Path(self.out_dir) / "checkpoints"


@dataclass(frozen=True)
class ViewerSettings:
    """The live web viewer on rank 0 (``port`` 0: off)."""

    TITLE: ClassVar[str] = "web viewer (docs/viewer.md)"  # its --help group

    viewer: int
    viewer_host: str
    viewer_budget_ms: float
    viewer_share: float


@dataclass(frozen=True)
class Settings:
    """Every option of a training run, by concern. ``flags`` is the resolved flat view (JSON values only),
    what checkpoints record and what every rank must agree on."""

    scene: SceneSettings
    model: ModelSettings
    runtime: RuntimeSettings
    step: StepSettings
    loop: LoopSettings
    eval: EvalSettings
    output: OutputSettings
    viewer: ViewerSettings
    data: DataSettings
    monitor: MonitorSettings
    flags: dict

    @staticmethod
    def from_namespace(
        ns: argparse.Namespace,
        n_steps: int,
        stop_signals: tuple[str, ...],
        comm: CommSettings,
        data: DataSettings,
        monitor: MonitorSettings,
    ) -> "Settings":
        """Fill every group from the validated flags ``ns`` and the values derived from them
        (``config.validate`` computes those, in one place)."""
        values = {
            **vars(ns),
            "n_steps": n_steps,
            "stop_signals": stop_signals,
            "comm": comm,
            "eval_at_s": tuple(ns.eval_at_s),
            "eval_at_steps": tuple(ns.eval_at_steps),
        }

        def take(cls: type, **extra: Any):
            return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name not in extra}, **extra)

        flags = {
            k: (n_steps if k == "n_steps" else v)
            for k, v in vars(ns).items()
            if isinstance(v, (str, int, float, bool, dict, list, type(None)))
        }
        return Settings(
            take(SceneSettings),
            take(ModelSettings, blocks=ns.model),
            take(RuntimeSettings),
            take(StepSettings),
            take(LoopSettings),
            take(EvalSettings),
            take(OutputSettings),
            take(ViewerSettings),
            data,
            monitor,
            flags,
        )
