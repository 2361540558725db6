"""Run under ``horovodrun -np 2``: the data pipeline's cross-rank facts, asserted on every rank.

    python tests/parallel/check_sampling.py modes SCENE_CACHE OUT_DIR
        trains with each --sampling strategy and with a streamed store under a memory cap; after each run
        the ranks' parameters and data decisions (placement, epoch, shares, error map) must be identical.
    HVD_NGP_FAULTS=slow@0:1-1000 python tests/parallel/check_sampling.py slow_rank SCENE_CACHE OUT_DIR
        rank 0 made slower per sample (the ``slow`` test fault), trained with --balance off, samples and
        time; the ranks must agree on every plan, and only --balance time moves work off rank 0. Prints
        ``SHARES {"off": [...], "samples": [...], "time": [...]}`` and ``SPREAD {...}`` (the per-interval
        step-time spreads the monitor reports; the test compares them).

Prints ``CHECK <name> OK`` lines on rank 0; any failure raises (non-zero exit).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import TINY_ARGS, tensor_digest as digest  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.config import CPU_CONFIG, parse_args  # noqa: E402
from hvd_ngp.training.trainer import RunResult, run  # noqa: E402

SEED = 0


def train(argv: list[str]) -> RunResult:
    args = parse_args(
        ["--config", str(CPU_CONFIG), *TINY_ARGS, "--device", "cpu", "--save_renders", "0", "--seed", str(SEED), *argv]
    )
    return run(args)


def assert_ranks_agree(result: RunResult, name: str) -> None:
    """Parameters, occupancy grid and every data decision identical on all ranks."""
    mine = {
        "parameters": digest(result.field.parameters()),
        "grid": digest([result.grid.density]),
        "data": json.dumps(result.metrics["data"], sort_keys=True),
    }
    every = dist.allgather_object(mine, name=f"check.{name}")
    for key in mine:
        assert all(e[key] == every[0][key] for e in every), f"{name}: {key} differs across ranks: {every}"
    assert math.isfinite(result.metrics["test_psnr"]), result.metrics
    if dist.runtime().is_root:
        print(f"CHECK {name} OK ({result.step} steps; data {result.metrics['data']})", flush=True)


def check_modes(cache: str, out: str) -> None:
    common = ["--scene_cache", cache, "--n_steps", "24", "--log_every", "8"]
    for sampling in ("uniform", "complexity", "error_map"):
        result = train([*common, "--sampling", sampling, "--error_map_interval", "6", "--out_dir", f"{out}/{sampling}"])
        data = result.metrics["data"]
        assert data["sampling"] == sampling
        if sampling == "error_map":
            assert data["error_map_updates"] == 4, data
        assert_ranks_agree(result, f"sampling_{sampling}")
    # a memory cap far below the decoded scene (64 x 80 x 80 x 4 bytes = 1.6 MB): images stream from disk
    result = train(
        [
            *common,
            "--preload",
            "auto",
            "--device_image_budget_gb",
            "0.0002",
            "--host_image_budget_gb",
            "0.0002",
            "--out_dir",
            f"{out}/stream",
        ]
    )
    assert result.metrics["data"]["placement"] == "stream" and result.metrics["data"]["shard_by"] == "image"
    assert_ranks_agree(result, "streamed_under_memory_cap")


def check_slow_rank(cache: str, out: str) -> None:
    shares, spreads = {}, {}
    for balance in ("off", "samples", "time"):
        result = train(
            [
                "--scene_cache",
                cache,
                "--balance",
                balance,
                "--target_samples",
                "8192",
                "--n_rays_init",
                "256",
                "--n_steps",
                "48",
                "--log_every",
                "8",
                "--n_eval_views",
                "1",
                "--out_dir",
                f"{out}/{balance}",
            ]
        )
        assert_ranks_agree(result, f"slow_rank_balance_{balance}")
        data = result.metrics["data"]
        shares[balance] = data["sample_shares"]
        spreads[balance] = [round(h["step_time_spread"], 3) for h in result.metrics["history"]]
        if balance == "time":
            # the slow rank's samples/s is a fraction of the other's: the plan must move work off it
            assert data["rebalances"] >= 1 and shares["time"][0] < 0.85 < 1.15 < shares["time"][1], data
        else:
            assert data["rebalances"] == 0 and shares[balance] == [1.0, 1.0], data
            assert (data["equal_rays"] is not None) == (balance == "off"), data
    if dist.runtime().is_root:
        print("SHARES " + json.dumps(shares), flush=True)
        print("SPREAD " + json.dumps(spreads), flush=True)


def main() -> None:
    mode, *rest = sys.argv[1:]
    dist.init("cpu")
    if mode == "modes":
        check_modes(*rest)
    elif mode == "slow_rank":
        check_slow_rank(*rest)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
