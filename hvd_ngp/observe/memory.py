"""GPU memory: one budget per process, buffer sizes planned from it, and peak readings per phase.

The budget (``--gpu_memory_gb``; default: the GPU's free memory at start minus a margin, shared by the
ranks on that GPU) is what this process may hold. ``--gpu_memory_gb`` also caps the process
(``torch.cuda.set_per_process_memory_fraction``), so a large card behaves like a small one.

From the budget come: the fit check before training (model, optimizer state, occupancy grid, step
buffers; ``check_fit``), and the chunks of evaluation and rendering, planned by the renderer from what
``MemoryBudget.available`` leaves (``render.plan``).

``MemoryMeter`` reads torch's peak allocated and reserved bytes per phase (training step,
evaluation), resetting the peaks at each phase's start.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from ..errors import HvdNgpError

GIB = float(1 << 30)
MARGIN_FRACTION = 0.05  # of the card, left free by the default budget (CUDA context, other processes)
MARGIN_MIN_BYTES = 1 << 30
DEFAULT_ROW_BYTES = 2048  # a network row without gradients, where it cannot be measured (CPU)


class MemoryBudgetError(HvdNgpError):
    """The scene, model or step does not fit the process's GPU memory budget; the message says what to lower."""


def human_gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class MemoryBudget:
    """What this process may hold on its device: ``bytes`` (None: no bound, a CPU run without
    ``--gpu_memory_gb``) and ``source``, how it was chosen (for messages)."""

    bytes: int | None
    source: str
    device: torch.device

    @staticmethod
    def for_device(device: torch.device, gpu_memory_gb: float = 0.0, ranks_on_device: int = 1) -> "MemoryBudget":
        """The budget of a process on ``device`` (see the module docstring); caps the process when
        ``gpu_memory_gb`` is given on a GPU."""
        if gpu_memory_gb < 0:
            raise MemoryBudgetError(f"--gpu_memory_gb must be >= 0 (0: the free memory), got {gpu_memory_gb}")
        if device.type != "cuda":
            if gpu_memory_gb > 0:
                return MemoryBudget(int(gpu_memory_gb * GIB), f"--gpu_memory_gb {gpu_memory_gb:g}", device)
            return MemoryBudget(None, "unbounded (CPU)", device)
        free, total = torch.cuda.mem_get_info(device)
        if gpu_memory_gb > 0:
            want = int(gpu_memory_gb * GIB)
            if want > total:
                raise MemoryBudgetError(f"--gpu_memory_gb {gpu_memory_gb:g} exceeds this GPU's {human_gib(total)}")
            torch.cuda.set_per_process_memory_fraction(want / total, device)
            return MemoryBudget(want, f"--gpu_memory_gb {gpu_memory_gb:g} (process capped)", device)
        margin = max(MARGIN_MIN_BYTES, int(MARGIN_FRACTION * total))
        share = max(free - margin, 0) // max(ranks_on_device, 1)
        per = f" / {ranks_on_device} ranks on this GPU" if ranks_on_device > 1 else ""
        return MemoryBudget(int(share), f"free {human_gib(free)} - margin {human_gib(margin)}{per}", device)

    def available(self) -> int | None:
        """Bytes left under the budget now (None: no bound): the budget less what torch holds allocated."""
        if self.bytes is None:
            return None
        held = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        return max(self.bytes - held, 0)


def ranks_on_device(local_rank: int, local_size: int, device_count: int) -> int:
    """Local ranks that share this rank's GPU (ranks are pinned to ``local_rank % device_count``)."""
    if device_count <= 0:
        return 1
    index = local_rank % device_count
    return len(range(index, local_size, device_count))


# ------------------------------------------------------------------------------------ fit check


@dataclass(frozen=True)
class TrainingFootprint:
    """Bytes training holds: parameters with gradients, Adam's two moments and the optional average;
    the occupancy grid; the step's buffers; the training images on the device."""

    parameters: int
    grid: int
    step: int
    images: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.grid + self.step + self.images

    def describe(self) -> str:
        return (
            f"model and optimizer {human_gib(self.parameters)}, occupancy grid {human_gib(self.grid)}, "
            f"step buffers {human_gib(self.step)}, images on the GPU {human_gib(self.images)}"
        )


def training_footprint(
    n_params: int,
    copies: int,
    grid_cells: int,
    candidate_capacity: int,
    sample_capacity: int,
    step_costs: "StepCosts",
    image_bytes: int = 0,
) -> TrainingFootprint:
    """Estimate from the sizes (``copies``: fp32 tensors per parameter: value, gradient, Adam's two
    moments, the average)."""
    step = candidate_capacity * step_costs.per_candidate + sample_capacity * step_costs.per_sample
    return TrainingFootprint(4 * n_params * copies, 5 * grid_cells, int(step), int(image_bytes))


@dataclass(frozen=True)
class StepCosts:
    """Bytes per marching candidate (with its no-gradient density query) and per sample through the
    network with gradients, at the step's peak."""

    per_candidate: int
    per_sample: int


#: measured on an H200 (lego, 2^18 samples/step: 1.1 GiB peak) and rounded up: a candidate carries its
#: slots and its density query without gradients, a sample its rows through both MLPs with autograd
STEP_COSTS = StepCosts(per_candidate=768, per_sample=3072)
EVAL_RESERVE = 256 << 20  # the least an evaluation should have to itself


def check_fit(budget: MemoryBudget, footprint: TrainingFootprint, eval_reserve: int) -> None:
    """Refuse, before training, a run whose footprint plus the smallest evaluation does not fit."""
    if budget.bytes is None or footprint.total + eval_reserve <= budget.bytes:
        return
    biggest = max(
        (
            (
                "the hash table (lower encoding.log2_hashmap_size or n_levels, or split it by space over "
                "ranks with --model_parallel K)",
                footprint.parameters,
            ),
            ("the step buffers (lower --target_samples or marching.candidate_factor)", footprint.step),
            ("the training images (--preload host or stream, or --downscale)", footprint.images),
        ),
        key=lambda kv: kv[1],
    )[0]
    raise MemoryBudgetError(
        f"training needs about {human_gib(footprint.total + eval_reserve)} of GPU memory ({footprint.describe()}, "
        f"evaluation at least {human_gib(eval_reserve)}) but the budget is {human_gib(budget.bytes)} "
        f"({budget.source}); the largest part is {biggest}"
    )


# ------------------------------------------------------------------------------------ host memory

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


@dataclass(frozen=True)
class HostMemory:
    """Host memory this process may still take: ``available`` bytes (the smaller of the kernel's
    ``MemAvailable`` and the job's cgroup limit less its usage; 0: unknown) and where that came from."""

    available: int
    source: str


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, ValueError):
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= UNLIMITED else value


def cgroup_memory_limit(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT
) -> tuple[int, int, Path] | None:
    """The tightest memory limit of this process's cgroups -> (limit, usage, limit file), or None (no limit).

    cgroup v2 (``0::/path``): ``memory.max`` and ``memory.current``; v1 (a ``memory`` controller line):
    ``memory/…/memory.limit_in_bytes`` and ``memory.usage_in_bytes``. The cgroup's folder and each of its
    ancestors up to the mount are read (a SLURM job step sits below the job's limit); inside a container the
    path the kernel names may not exist under the container's mount, whose own folder then holds the limit."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2 unified hierarchy
            base, limit_name, usage_name = root, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name = root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        folder = base / rel.lstrip("/")
        while True:
            if (folder / limit_name).is_file():
                limit = _read_int(folder / limit_name)
                if limit is not None:
                    candidates.append((limit, _read_int(folder / usage_name) or 0, folder / limit_name))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    if not candidates:
        return None
    return min(candidates, key=lambda c: c[0] - c[1])


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def host_memory(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> HostMemory:
    """What this process may still take of host memory: the kernel's ``MemAvailable``, bounded by the job's
    cgroup (a SLURM ``--mem`` job, a container) when that is tighter."""
    free = _meminfo_available()
    limit = cgroup_memory_limit(proc_cgroup, root)
    if limit is not None and (free == 0 or limit[0] - limit[1] < free):
        left = max(limit[0] - limit[1], 0)
        return HostMemory(left, f"cgroup limit {human_gib(limit[0])} ({limit[2]}) less {human_gib(limit[1])} used")
    return HostMemory(free, f"MemAvailable {human_gib(free)}" if free else "unknown")


def host_memory_available() -> int:
    """Bytes of host memory available now to this process (``host_memory``), or 0 when unknown."""
    return host_memory().available


def check_host_fit(need: int, host: HostMemory, ranks_on_host: int, what: str) -> None:
    """Refuse, before training, a plan whose host memory per rank (``need`` bytes: ``what``) exceeds this rank's
    share of what the host and the job's cgroup allow."""
    if host.available <= 0:
        return
    share = host.available // max(ranks_on_host, 1)
    if need <= share:
        return
    per = f" / {ranks_on_host} ranks on this host" if ranks_on_host > 1 else ""
    raise MemoryBudgetError(
        f"training needs about {human_gib(need)} of host memory per rank ({what}) but each rank may take "
        f"{human_gib(share)} ({host.source}{per}); lower --target_samples, use --preload stream or --downscale, "
        f"or ask the scheduler for more memory (SLURM --mem)"
    )


# ------------------------------------------------------------------------------------ readings


@dataclass
class PhasePeak:
    """Largest torch allocated / reserved bytes seen in one phase."""

    allocated: int = 0
    reserved: int = 0

    def as_gib(self) -> dict:
        return {"allocated_gib": round(self.allocated / GIB, 3), "reserved_gib": round(self.reserved / GIB, 3)}


@dataclass
class MemoryMeter:
    """Peak torch memory per phase on a CUDA device (a no-op elsewhere): ``with meter.phase("eval"): ...``;
    the training step's peak is read with ``read("step")`` at the end of each log interval."""

    device: torch.device
    peaks: dict[str, PhasePeak] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.device.type == "cuda"

    def read(self, name: str) -> PhasePeak:
        """The peaks since the last reset (returned), folded into ``name``'s; then reset them."""
        span = PhasePeak()
        if self.active:
            span = PhasePeak(torch.cuda.max_memory_allocated(self.device), torch.cuda.max_memory_reserved(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        peak = self.peaks.setdefault(name, PhasePeak())
        peak.allocated, peak.reserved = max(peak.allocated, span.allocated), max(peak.reserved, span.reserved)
        return span

    @contextlib.contextmanager
    def phase(self, name: str, release: bool = True) -> Iterator[None]:
        """Measure ``name`` alone (the peaks before it go to "step"); with ``release`` hand the cached
        blocks back afterwards, so the footprint returns to the step's."""
        if self.active:
            self.read("step")
        try:
            yield
        finally:
            if self.active:
                self.read(name)
                if release:  # then restart the peaks from the released footprint, not from the phase's
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(self.device)

    def summary(self) -> dict:
        return {name: peak.as_gib() for name, peak in self.peaks.items()}


def bytes_per_row(fn, rows: int, device: torch.device, default: int) -> int:
    """Peak bytes per row of ``fn(rows)`` measured on a CUDA device (``default`` elsewhere), rounded up
    with a 25% allowance."""
    if device.type != "cuda":
        return default
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn(rows)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    return max(int(math.ceil(1.25 * peak / rows)), 1)


@contextlib.contextmanager
def out_of_memory_as_error(stage: str, budget: MemoryBudget, hint: str) -> Iterator[None]:
    """Turn a CUDA out-of-memory error inside ``stage`` into one line naming the stage, the budget and
    ``hint`` (the option to change)."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        held = human_gib(torch.cuda.memory_allocated(budget.device)) if budget.device.type == "cuda" else "?"
        first = str(exc).splitlines()[0][:120] if str(exc) else "out of memory"
        limit = human_gib(budget.bytes) if budget.bytes is not None else "none"
        raise MemoryBudgetError(
            f"out of GPU memory in the {stage} (budget {limit}: {budget.source}; {held} allocated; {first}): {hint}"
        ) from None
