"""One launch of ``bench links``: every rank times Horovod's allreduce of CPU tensors; rank 0 writes the result.

    python -m hvd_ngp.bench._links_rank --result PATH --sizes_mib 1,4,16,64 --repeats 5

Rows {mib, bytes, best_s, median_s}: the best and the median of ``repeats`` timed calls after one warm-up,
each the largest over the ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cluster import dist
from ..errors import run_cli
from ..options import options_from


def time_allreduce(n_bytes: int, repeats: int, name: str) -> tuple[float, float]:
    """(best, median) seconds of one fp32 allreduce of ``n_bytes`` over ``repeats`` calls after one warm-up, each
    call preceded by a barrier. Collective."""
    tensor = torch.ones(n_bytes // 4)
    times = []
    for i in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        dist.allreduce(tensor, "sum", name=name)
        if i:
            times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


@dataclass(frozen=True)
class LinksRankOptions:
    """One rank's side of ``bench links``: where its result goes, what it times."""

    result: str
    sizes_mib: str
    repeats: int


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.bench._links_rank")
    p.add_argument("--result", required=True)
    p.add_argument("--sizes_mib", default="1,4,16,64")
    p.add_argument("--repeats", type=int, default=5)
    opts = options_from(LinksRankOptions, p.parse_args(argv))
    rt = dist.init("cpu", threads=1)
    rows = []
    for mib in [float(s) for s in opts.sizes_mib.split(",")]:
        n_bytes = int(mib * 2**20) // 4 * 4
        times = torch.tensor(time_allreduce(n_bytes, opts.repeats, f"links.{mib:g}"), dtype=torch.float64)
        best, median = (float(t) for t in dist.allreduce(times, "max", name=f"links.max.{mib:g}"))
        rows.append({"mib": mib, "bytes": n_bytes, "best_s": best, "median_s": median})
    if rt.is_root:
        Path(opts.result).write_text(
            json.dumps(
                {
                    "ranks": rt.size,
                    "nodes": rt.cross_size,
                    "controller": rt.controller,
                    "rows": rows,
                    "hierarchical_env": os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE", ""),
                },
                indent=1,
            )
        )
    dist.barrier()
    return 0


if __name__ == "__main__":
    run_cli(main, prog="bench._links_rank")
