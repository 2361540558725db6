"""Render plans: how much of a render fits the memory left under the process's budget
(``observe.memory.MemoryBudget.available``): rays per chunk, candidate slots of the fast renderer's marching
workspace, rows per network call (``plan_render``), or rays per chunk of the reference renderer
(``reference_chunk``). A render never holds more than its plan, whatever the scene, so the caching allocator
does not grow to the whole card. Pure arithmetic on byte counts; no device is touched.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..observe.memory import DEFAULT_ROW_BYTES, MemoryBudgetError, human_gib

#: of the free budget at render time: the allocator's rounding and fragmentation, cuBLAS workspaces
RENDER_HEADROOM = 0.8
#: upper bounds of a render plan: beyond them the kernels are saturated and memory only grows. 2^20 rays: one chunk
#: per 800x800 view, so a third of the host's per-window work of 2^18 (lego, H100, 2026-12-07: 0.046 against
#: 0.053 s per view, docs/inference.md)
MAX_CHUNK_RAYS = 1 << 20
MAX_CANDIDATES = 1 << 25
#: 2^23 rows: single_pass's first window of an 800x800 view (640k rays x 8 slots) in one group, not three. lego20,
#: H100, 2026-12-07, against 2^21: with instant-ngp's marching 0.0186 -> 0.0101 s per view in the sweep's process,
#: 0.0164 -> 0.0118 in the render tool's own; with the defaults 0.0202 -> 0.0164 and 0.0172 -> 0.0182 (docs/inference.md)
MAX_ROWS = 1 << 23
#: bytes per dense-lane slot of the reference renderer (positions, times, masks, densities, weights),
#: besides its network row
REFERENCE_LANE_BYTES = 256
REFERENCE_MAX_CHUNK = 1 << 14


@dataclass(frozen=True)
class RenderCosts:
    """Bytes one item of a render holds at its peak: per ray of a chunk, per candidate slot of the
    marching workspace (with the compaction that follows it), per row of a network call."""

    per_ray: int
    per_candidate: int
    per_row: int


@dataclass(frozen=True)
class RenderPlan:
    """Sizes of one render: ``rays`` per chunk, ``candidates`` slots in the marching workspace (at least
    one ray's worst case), ``rows`` per network call."""

    rays: int
    candidates: int
    rows: int


def plan_render(
    available: int | None, costs: RenderCosts, max_candidates_per_ray: int, what: str = "rendering"
) -> RenderPlan:
    """The largest plan that fits ``available`` bytes (None: the upper bounds).

    The budget is split 1 : 3 : 4 between the ray chunk, the candidate workspace and the network rows
    (after ``RENDER_HEADROOM``). Never zero; ``MemoryBudgetError`` when even one ray's worst case
    (``max_candidates_per_ray`` candidates and a network call of one row) does not fit."""
    if available is None:
        return RenderPlan(MAX_CHUNK_RAYS, MAX_CANDIDATES, MAX_ROWS)
    usable = int(available * RENDER_HEADROOM)
    rays = min(MAX_CHUNK_RAYS, usable // 8 // costs.per_ray)
    candidates = min(MAX_CANDIDATES, 3 * usable // 8 // costs.per_candidate)
    rows = min(MAX_ROWS, usable // 2 // costs.per_row)
    least = costs.per_ray + max_candidates_per_ray * costs.per_candidate + costs.per_row
    if rays < 1 or candidates < max_candidates_per_ray or rows < 1:
        raise MemoryBudgetError(
            f"{what} needs at least {human_gib(least / RENDER_HEADROOM)} of GPU memory for one ray "
            f"({max_candidates_per_ray} marching candidates), but only {human_gib(available)} are free under the "
            f"budget: raise --gpu_memory_gb, or lower encoding.log2_hashmap_size or marching.max_steps"
        )
    return RenderPlan(int(rays), int(candidates), int(rows))


def split_by_capacity(ends: list[int], capacity: int) -> list[tuple[int, int]]:
    """Consecutive ray ranges ``[a, b)`` whose candidates fit ``capacity``; ``ends`` ``[R]``: the running
    total of candidates per ray (a cumulative sum). Every range holds at least one ray."""
    groups, a, base = [], 0, 0
    while a < len(ends):
        # the largest b with ends[b-1] - base <= capacity (one ray always goes, the plan guarantees it fits)
        b = max(bisect.bisect_right(ends, base + capacity, lo=a), a + 1)
        groups.append((a, b))
        base, a = ends[b - 1], b
    return groups


def reference_chunk(available: int | None, lanes_per_ray: int, row_bytes: int = DEFAULT_ROW_BYTES) -> int:
    """Rays per chunk of the reference renderer within ``available`` bytes (None: the default chunk), each
    lane holding ``REFERENCE_LANE_BYTES`` and a network row of ``row_bytes``; ``MemoryBudgetError`` when one
    ray's dense lanes do not fit."""
    if available is None:
        return REFERENCE_MAX_CHUNK
    lane_bytes = REFERENCE_LANE_BYTES + row_bytes
    rays = int(available * RENDER_HEADROOM) // (lanes_per_ray * lane_bytes)
    if rays < 1:
        raise MemoryBudgetError(
            f"rendering one ray needs {human_gib(lanes_per_ray * lane_bytes / RENDER_HEADROOM)} "
            f"of GPU memory ({lanes_per_ray} steps), but only {human_gib(available)} are free "
            f"under the budget: raise --gpu_memory_gb or lower marching.max_steps"
        )
    return min(rays, REFERENCE_MAX_CHUNK)
