"""The recipe: training's parts built from the model config (``configs/nerf/*.json``) and the scene.

``Marching`` (the marching block -> step schedule and occupancy settings), ``make_grid``,
``make_optimizer`` (Adam + ExponentialDecay, see ``optim``), ``make_loss``, ``make_scaler``,
``budget_lr_factor`` (the learning-rate steps of a time budget) and ``model_footprint`` (training's
memory from the config alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cluster.comm import CommSettings
from ..data import Scene
from ..errors import ConfigError
from ..model.encoding.hashgrid import HashGridSpec, scaled_to_extent
from ..model.field import NGPField
from ..observe.memory import STEP_COSTS, TrainingFootprint, training_footprint
from ..render import MarchLaunch, StepSchedule
from ..render.occupancy import OccupancyGrid, n_cascades_for
from .optim import Adam, OptimizerChain, exponential_decay

DEFAULT_CANDIDATE_FACTOR = 4.0


@dataclass(frozen=True)
class Marching:
    """Ray-marching settings derived from the ``marching`` block and the scene."""

    schedule: StepSchedule
    early_termination: float
    update_interval: int
    warmup_steps: int
    update_ramp: bool = False  # instant-ngp's cadence in the first steps (``update_due``)
    launch: MarchLaunch | None = None  # ``kernel_launch``: how the Triton march runs (None: its default)
    eval_schedule: StepSchedule | None = (
        None  # ``eval_steps_per_diagonal``: evaluations and renders (None: ``schedule``)
    )
    candidate_factor: float = DEFAULT_CANDIDATE_FACTOR  # marched samples per network sample the fast buffers hold

    @property
    def render_schedule(self) -> StepSchedule:
        """The step rule of evaluations and renders (a finer one than training's where the block asks)."""
        return self.eval_schedule or self.schedule

    def update_due(self, step: int) -> bool:
        """Whether 0-based ``step`` refreshes the occupancy grid: every ``update_interval`` steps, or with
        ``marching.update_schedule: "ramp"`` instant-ngp's cadence (testbed.cu: every
        ``clamp(step // 16, 1, update_interval)`` steps, so every step for the first 32, every 16 from 256)."""
        interval = min(max(step // 16, 1), self.update_interval) if self.update_ramp else self.update_interval
        return step % interval == 0

    @staticmethod
    def from_config(block: dict, scene_aabb_scale: int, source: str = "config") -> "Marching":
        """instant-ngp's constants: ``dt_min = sqrt(3) / steps_per_diagonal`` (the unit cube's diagonal),
        cone angle 1/256 for scenes larger than the unit cube ("auto"), and at most
        ``dt_min * 2^(cascades-1) * steps_per_diagonal / grid_resolution``. ``eval_steps_per_diagonal``
        (absent or null: as training) gives evaluations and renders the same rule with that many steps."""
        steps = int(block["steps_per_diagonal"])
        res = int(block["grid_resolution"])
        if steps <= 0 or res <= 0:
            raise ConfigError(f"{source}: marching.steps_per_diagonal and grid_resolution must be positive")
        eval_steps = block.get("eval_steps_per_diagonal")
        if eval_steps is not None and (
            not isinstance(eval_steps, int) or isinstance(eval_steps, bool) or eval_steps <= 0
        ):
            raise ConfigError(
                f"{source}: marching.eval_steps_per_diagonal must be a positive integer or null, got {eval_steps!r}"
            )
        cone = block.get("cone_angle", "auto")
        if cone == "auto":
            cone = 0.0 if scene_aabb_scale <= 1 else 1.0 / 256
        if not isinstance(cone, (int, float)) or cone < 0:
            raise ConfigError(f"{source}: marching.cone_angle must be 'auto' or a number >= 0, got {cone!r}")
        near = float(block.get("near_distance", 0.1))
        if near < 0:
            raise ConfigError(f"{source}: marching.near_distance must be >= 0, got {near}")
        update = block.get("update_schedule", "fixed")
        if update not in ("fixed", "ramp"):
            raise ConfigError(f"{source}: marching.update_schedule must be 'fixed' or 'ramp', got {update!r}")
        interval, warmup = int(block["update_interval"]), int(block["warmup_steps"])
        if interval < 1:
            raise ConfigError(f"{source}: marching.update_interval must be >= 1 (steps), got {interval}")
        if warmup < 0:
            raise ConfigError(f"{source}: marching.warmup_steps must be >= 0, got {warmup}")
        early = float(block["early_termination"])
        if not 0 <= early < 1:
            raise ConfigError(f"{source}: marching.early_termination must be in [0, 1) (a transmittance), got {early}")
        factor = candidate_factor(block, source)

        def rule(n: int) -> StepSchedule:
            dt_min = math.sqrt(3.0) / n
            dt_max = dt_min * 2 ** (n_cascades_for(scene_aabb_scale) - 1) * max(n / res, 1.0)
            return StepSchedule(dt_min, dt_max, float(cone), int(block.get("max_steps", 4096)), near)

        return Marching(
            rule(steps),
            early,
            interval,
            warmup,
            update == "ramp",
            march_launch(block.get("kernel_launch"), source),
            None if eval_steps in (None, steps) else rule(eval_steps),
            factor,
        )


def candidate_factor(block: dict, source: str) -> float:
    """``marching.candidate_factor`` (default 4): the fast renderer's marched-sample slots per network sample."""
    factor = float(block.get("candidate_factor", DEFAULT_CANDIDATE_FACTOR))
    if factor < 1:
        raise ConfigError(
            f"{source}: marching.candidate_factor must be >= 1 (marched samples per network sample), got {factor}"
        )
    return factor


def march_launch(value, source: str) -> MarchLaunch | None:
    """``marching.kernel_launch``: ``{"block": rays per program, "segment": steps per program, "warps": n}``
    (any subset; powers of two) -> a ``MarchLaunch``; absent -> None (the kernel's default)."""
    if value is None:
        return None
    known = {"block", "segment", "warps"}
    if not isinstance(value, dict) or not set(value) <= known:
        raise ConfigError(
            f"{source}: marching.kernel_launch must be an object with keys among {sorted(known)}, got {value!r}"
        )
    try:
        return MarchLaunch(**value)
    except ValueError as e:
        raise ConfigError(f"{source}: marching.kernel_launch: {e}") from None


def make_grid(block: dict, scene: Scene) -> OccupancyGrid:
    return OccupancyGrid(
        scene.aabb,
        int(block["grid_resolution"]),
        n_cascades_for(scene.aabb_scale),
        float(block["threshold"]),
        float(block["decay"]),
    )


def make_optimizer(
    field: NGPField, block: dict, source: str, capturable: bool = False
) -> tuple[torch.optim.Adam, Callable[[int], float]]:
    """Adam (L2 ``l2_reg`` on the MLP weights, ``l2_reg_encoding`` on the hash table, default 0 as in
    instant-ngp; the hash table sparse with ``sparse_hash_updates``; torch's
    fused single-kernel implementation with ``"fused": true``, and by default (``"auto"``) for the graphed step)
    and ``lr_at(step)`` for the ExponentialDecay schedule (see ``optim``). ``capturable``: Adam's step
    can be captured in a CUDA graph (``training.graphed``; its step counts live on the device)."""
    chain = OptimizerChain.parse(block, source)
    adam = chain.adam
    lr = float(adam.get("learning_rate", 1e-2))
    fused = adam.get("fused", "auto")
    if fused not in (True, False, "auto"):
        raise ConfigError(f'{source}: optimizer Adam.fused must be true, false or "auto", got {fused!r}')
    if fused == "auto":  # one H200, lego: graph B's GPU time 0.42 -> 0.16 ms per step (docs/BENCHMARKS.md)
        fused = capturable and all(p.is_cuda for p in field.parameters())
    sparse = bool(adam.get("sparse_hash_updates", False))
    l2_table = adam.get("l2_reg_encoding", 0.0)  # nerfacc's instant-ngp decays the table too; instant-ngp does not
    if isinstance(l2_table, bool) or not isinstance(l2_table, (int, float)) or not 0.0 <= l2_table < 1.0:
        raise ConfigError(f"{source}: optimizer Adam.l2_reg_encoding must be a number in [0, 1), got {l2_table!r}")
    if l2_table and sparse:
        raise ConfigError(
            f"{source}: optimizer Adam.l2_reg_encoding needs dense hash-table updates "
            f"(sparse_hash_updates false): the sparse rule leaves untouched entries alone"
        )
    opt = Adam(
        [
            {"params": field.encoding_parameters(), "weight_decay": float(l2_table), "sparse": sparse},
            {"params": field.mlp_parameters(), "weight_decay": float(adam.get("l2_reg", 1e-6))},
        ],
        lr=lr,
        betas=(float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.99))),
        eps=float(adam.get("epsilon", 1e-15)),
        capturable=capturable,
        **({"fused": True} if fused else {}),
    )

    def lr_at(step: int) -> float:
        return lr * exponential_decay(step, chain.decay)

    return opt, lr_at


#: an element-wise loss ``(pred [R, 3], target [R, 3]) -> [R, 3]``
LossFn = Callable[[Tensor, Tensor], Tensor]


def make_loss(block: dict, source: str) -> LossFn:
    """The ``loss`` block -> an element-wise loss ``(pred, target) -> [R, 3]`` (reduced by ``masked_mean``)."""
    otype = block.get("otype", "L2")
    if otype == "L2":
        return lambda pred, target: (pred - target) ** 2
    if otype == "Huber":
        delta = float(block.get("delta", 0.1))
        return lambda pred, target: F.huber_loss(pred, target, delta=delta, reduction="none") / delta
    if otype == "L1":
        return lambda pred, target: (pred - target).abs()
    raise ConfigError(f"{source}: loss.otype {otype!r} is unknown (L2, Huber, L1)")


def resolve_precision(precision: str, device: torch.device, backend: str, model_parallel: bool = False) -> str:
    """The MLPs' autocast precision ``auto`` stands for: bf16 for the triton backend on a CUDA GPU
    (it then trains the MLPs with the fused kernels, ``model.field``), fp32 elsewhere.

    Measured on one H200 (lego, docs/BENCHMARKS.md): bf16 with the fused MLPs ran 1.3x fp32's samples/s,
    matched it at equal steps (2000 steps: 32.77 against 32.74 dB) and led it on a 60 s budget with both
    seeds (34.86 / 34.77 against 34.67 / 34.46 dB). tcnn keeps its own half-precision MLPs; model-parallel
    segments and the CPU keep fp32 (not measured in bf16)."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" and backend == "triton" and not model_parallel else "fp32"


def make_scaler(precision: str, comm: CommSettings, device: torch.device, size: int) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 autocast, or for fp16-compressed gradients when ranks average them.

    Half precision flushes gradients below 6e-8 to zero and keeps little precision below 6e-5, where
    most hash-grid and density-MLP gradients live (median 1e-6 and 3e-8 on the tiny CPU config), so
    fp16 compression runs under dynamic loss scaling (initial scale 2^16): an overflow gives inf
    after the allreduce, the same on every rank, and every rank skips that step and halves the scale.
    """
    if precision == "fp16" or (comm.loss_scaled_compression and size > 1):
        return torch.amp.GradScaler(device.type)
    return None


BUDGET_LR_MILESTONES = (0.5, 0.75, 0.9)  # fractions of --time_budget_s (nerfacc's step schedule, on time)
BUDGET_LR_GAMMA = 0.33


def budget_lr_factor(elapsed_s: float, budget_s: float, mode: str = "on") -> float:
    """Learning-rate factor after ``elapsed_s`` seconds of a ``budget_s`` training budget (1 without one).

    Every rank passes the same shared clock reading, so every rank applies the same factor."""
    if mode != "on" or not budget_s:
        return 1.0
    return BUDGET_LR_GAMMA ** sum(elapsed_s >= m * budget_s for m in BUDGET_LR_MILESTONES)


def model_footprint(model: dict, target_samples: int, scene: Scene) -> TrainingFootprint:
    """Training's memory from the config alone, before anything is built (``observe.memory.check_fit``);
    ``model``: the config this rank builds (model parallel: one region's, ``model_parallel.region_model``)."""
    extent = float((scene.aabb[1] - scene.aabb[0]).max())
    spec = HashGridSpec.from_config(scaled_to_extent(model["encoding"], extent), model["_source"])
    n_params = spec.n_params * spec.n_features_per_level + MLP_PARAMS_ALLOWANCE  # table entries x features
    block = model["marching"]
    cells = int(block["grid_resolution"]) ** 3 * n_cascades_for(scene.aabb_scale)
    factor = candidate_factor(block, model["_source"])
    return training_footprint(
        n_params, PARAMETER_COPIES, cells, int(factor * target_samples), target_samples, STEP_COSTS
    )


MLP_PARAMS_ALLOWANCE = 1 << 16  # the two MLPs hold about 10k parameters
PARAMETER_COPIES = 5  # value, gradient, Adam's two moments, the average (Ema)
