"""``python -m hvd_ngp.bench batch``: steps to a test PSNR at K backward passes per step, on one device.

    python -m hvd_ngp.bench batch --ks 1,2,4,8,16 --seeds 1337,1 --psnr_targets 33,35 \\
        --eval_every 2000 --n_eval_views 5 --budget_s 420 --json runs/bench/batch.json -- --scene /tmp/stage/lego

N data-parallel ranks averaging their gradients compute what one rank computes with N x the samples per
step: ``--backward_passes_per_step K`` draws K x ``--target_samples``, back-propagates them in K passes and
takes one optimizer step with the learning rate of K ranks (``--lr_scaling``: sqrt(K) by default, the rule
``cluster.comm.CommSettings.lr_multiplier`` applies to ranks x passes). So the steps one device needs at K
are the steps K ranks would need; times (one device's step + the exposed allreduce on a fabric) they give
the time to quality at K GPUs (``bench fabric --steps_json`` reads this file).

For each seed, K and mode (in that order): one training run in this process (``training.trainer.run``), its
test PSNR on the first ``--n_eval_views`` test views every ``--eval_every`` / K steps (equal samples
between evaluations at every K; at least every step), stopped as soon as every target is reached, or
when its share of ``--budget_s`` training seconds (evaluations excluded; what earlier runs left,
split evenly over the runs still to come, at least half an even share) or ``--max_steps`` runs out. Records the first evaluated step
at which each target was reached (null: not within the run), the training step time (the first step,
with its kernel compilation, left out) and samples per step.

``--modes every,delayed_grid+fp16`` (bench syncmodes' names) runs each seed and K in each gradient sync: N ranks
of ``delayed`` or ``delayed_grid`` compute what one device computes with K = N passes in that mode, so its steps
are those N ranks' steps, and ``bench fabric --steps_json`` prices each mode with its own. ``periodic`` and
``+comp`` are refused: their ranks differ between syncs. ``--parallel P`` runs P of the runs at once, each its
own process on the same device: the steps do not depend on it, the step times do, so the JSON then has
``"shared_device": true`` and ``bench fabric`` prices the steps at its own ``--step_ms``.

JSON (``--json``), exactly: {"scene", "device", "step_ms_per_backward_pass" (the K = 1 runs' mean step,
else the smallest step / K), "runs": [{"k", "seed", "samples_per_step", "step_ms", "steps_to_psnr":
{"33": int | null, ...}, "final_psnr", "sync" (``every``, ``delayed_grid+fp16``, ...: ``fabric_model.sync_of``),
"lr_multiplier"}]} (with ``--parallel``: and "shared_device"), written after every run. ``--details_json``: each
run's PSNR curve, steps and seconds.
On a GPU the K = 1 step is the graphed one and K > 1 steps run eagerly (CUDA graphs refuse gradient
accumulation), so ``step_ms`` / K at K > 1 is above one rank's step at K ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch

from ..cluster.fabric_model import sync_of
from ..cluster.preempt import EXIT_PREEMPTED
from ..config import BASE_CONFIG, CPU_CONFIG, parse_settings
from ..errors import ConfigError
from ..options import options_from
from ..training.trainer import run
from .report import comma_list, table, write_json
from .syncmodes import MODES, mode_flags

EXIT_FAILED = 1  # --parallel: a run's process failed (the others' rows are written)


def _list(text: str, kind, what: str) -> list:
    values = comma_list(text, kind, what)
    if not values:
        raise ConfigError(f"--{what} is empty")
    return values


def target_key(target: float) -> str:
    return f"{target:g}"


def steps_to(curve: list[dict], target: float) -> int | None:
    """The first evaluated step whose PSNR reached ``target``, or None."""
    return next((int(c["step"]) for c in curve if c["psnr"] >= target), None)


def summary_of(runs: list[dict], where: dict, shared: bool = False) -> dict:
    """The JSON's object for the runs so far (``step_ms_per_backward_pass``: the K = 1 runs' mean step, else the
    smallest step / K; ``shared_device`` when the runs shared the device, ``--parallel``)."""
    ones = [r["step_ms"] for r in runs if r["k"] == 1]
    per_pass = sum(ones) / len(ones) if ones else min(r["step_ms"] / r["k"] for r in runs)
    return {**where, "step_ms_per_backward_pass": per_pass, "runs": runs, **({"shared_device": True} if shared else {})}


def write_results(opts: BatchOptions, runs: list[dict], details: list[dict], where: dict, shared: bool) -> None:
    """The JSON and the details JSON of the runs so far (written after every run, so a run killed later, by a
    wall-clock limit, leaves the ones before it)."""
    out = Path(opts.out_dir)
    write_json(opts.json or out / "batch.json", summary_of(runs, where, shared))
    write_json(opts.details_json or out / "details.json", {"options": asdict(opts), "runs": details})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.bench batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--ks", default="1,2,4,8,16", help="backward passes per step to measure")
    p.add_argument("--seeds", default="1337,1")
    p.add_argument("--psnr_targets", default="33,35", help="test PSNR targets in dB")
    p.add_argument(
        "--eval_every",
        type=int,
        default=2000,
        help="steps between evaluations at K = 1 (every eval_every / K steps at K)",
    )
    p.add_argument("--n_eval_views", type=int, default=5, help="test views per evaluation (0: all)")
    p.add_argument(
        "--budget_s",
        type=float,
        default=0.0,
        help="training seconds for all runs together (evaluations excluded; 0: no limit)",
    )
    p.add_argument(
        "--max_steps",
        type=int,
        default=0,
        help="steps per run at most (0: no limit; one of the two limits must be set)",
    )
    p.add_argument(
        "--modes",
        default="every",
        help="comma-separated gradient syncs, as bench syncmodes names them (every, delayed_grid+fp16, ...): each "
        "K of a mode is that many ranks of it on one device",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runs at once, each its own process on the same device (steps to PSNR do not depend on it; step "
        "times do, so the JSON says shared_device and bench fabric then prices steps at its own --step_ms)",
    )
    p.add_argument("--out_dir", default="runs/bench/batch")
    p.add_argument("--json", default=None, help="the result (default <out_dir>/batch.json)")
    p.add_argument("--details_json", default=None, help="curves and run lengths (default <out_dir>/details.json)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after '--': trainer flags for every run")
    return p


@dataclass(frozen=True)
class BatchOptions:
    """The command line of ``python -m hvd_ngp.bench batch`` (``build_parser`` holds each option's help)."""

    ks: str
    seeds: str
    psnr_targets: str
    eval_every: int
    n_eval_views: int
    budget_s: float
    max_steps: int
    modes: str
    parallel: int
    out_dir: str
    json: str | None
    details_json: str | None
    extra: list[str]  # trainer flags


def run_name(seed: int, k: int, mode: str) -> str:
    """A run's folder under ``--out_dir`` (and its files under ``parallel/``)."""
    return f"seed{seed}_k{k}" + ("" if mode == "every" else f"_{mode}")


def main(argv: list[str] | None = None) -> dict:
    opts = options_from(BatchOptions, build_parser().parse_args(argv))
    extra = [a for a in opts.extra if a != "--"]
    ks, seeds = _list(opts.ks, int, "ks"), _list(opts.seeds, int, "seeds")
    targets = sorted(_list(opts.psnr_targets, float, "psnr_targets"))
    modes = _list(opts.modes, str, "modes")
    if any(k < 1 for k in ks):
        raise ConfigError(f"--ks must be >= 1, got {opts.ks}")
    if opts.eval_every < 1:
        raise ConfigError(f"--eval_every must be >= 1, got {opts.eval_every}")
    if opts.budget_s <= 0 and opts.max_steps <= 0:
        raise ConfigError("give --budget_s or --max_steps (each run stops at its targets, or at these limits)")
    if opts.parallel < 1:
        raise ConfigError(f"--parallel must be >= 1, got {opts.parallel}")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ConfigError(f"--modes: unknown {unknown} (known: {', '.join(MODES)})")
    apart = [m for m in modes if m == "periodic" or m.endswith("+comp")]
    if apart:
        raise ConfigError(
            f"--modes {','.join(apart)}: the ranks of these modes differ between syncs, so K passes on one device do "
            "not compute what K ranks do (bench syncmodes measures them on real ranks)"
        )
    own = ["--backward_passes_per_step", "--seed", "--eval_every", "--n_eval_views", "--n_steps", "--time_budget_s"]
    if modes != ["every"]:
        own += ["--grad_sync", "--compression", "--delay_compensation"]
    for flag in own:
        if any(a == flag or a.startswith(flag + "=") for a in extra):
            raise ConfigError(f"{flag} is set by the benchmark for each run; leave it out of the trainer flags")
    plan = [(seed, k, mode) for seed in seeds for k in ks for mode in modes]
    shared = opts.parallel > 1 and len(plan) > 1
    if shared:
        runs, details, stopped, where = in_parallel(opts, extra, plan)
    else:
        runs, details, stopped, where = in_process(opts, extra, plan, targets)
    failed = EXIT_FAILED if shared else EXIT_PREEMPTED  # a parallel run that stops is a child that failed
    if not runs:
        raise SystemExit(failed)
    summary = summary_of(runs, where, shared)
    per_pass = summary["step_ms_per_backward_pass"]
    rows = [
        {
            "K": r["k"],
            "seed": r["seed"],
            "samples/step": r["samples_per_step"],
            "step ms": f"{r['step_ms']:.2f}",
            "ms per pass": f"{r['step_ms'] / r['k']:.2f}",
            "sync": r["sync"],
            "lr x": f"{r['lr_multiplier']:.3g}",
            **{f"steps to {key} dB": "-" if v is None else v for key, v in r["steps_to_psnr"].items()},
            **{
                f"samples to {key} dB (M)": "-" if v is None else f"{v * r['samples_per_step'] / 1e6:.3g}"
                for key, v in r["steps_to_psnr"].items()
            },
            "final dB": f"{r['final_psnr']:.2f}",
            "steps": d["steps"],
        }
        for r, d in zip(runs, details)
    ]
    print(
        f"{summary['device']}, scene {summary['scene']}; PSNR over {opts.n_eval_views or 'all'} test views every "
        f"{opts.eval_every} / K steps; one pass {per_pass:.2f} ms"
        + (f" (runs {opts.parallel} at once on one device: the step times are not one device's)" if shared else "")
    )
    print(table(rows, list(rows[0])))
    if not math.isfinite(per_pass):
        raise ConfigError("no step time was measured")
    if stopped:
        raise SystemExit(failed)
    return summary


def in_process(
    opts: BatchOptions, extra: list[str], plan: list[tuple[int, int, str]], targets: list[float]
) -> tuple[list[dict], list[dict], str | None, dict]:
    """The runs one after another in this process: (JSON rows, details, why they stopped early or None, scene
    and device)."""
    out = Path(opts.out_dir)
    left = opts.budget_s
    runs: list[dict[str, Any]] = []  # the JSON's rows
    details: list[dict[str, Any]] = []
    stopped: str | None = None  # why the runs stopped early
    where: dict[str, Any] = {}  # scene and device
    for i, (seed, k, mode) in enumerate(plan):
        # what earlier runs left, split over the runs to come; at least half an even share (a run may overrun its
        # share by up to 8 steps: the trainer reads its clock every 8 steps)
        share = max(left / (len(plan) - i), opts.budget_s / len(plan) / 2) if opts.budget_s > 0 else 0.0
        every = max(opts.eval_every // k, 1)
        flags = [
            *extra,
            *([] if mode == "every" else mode_flags(mode)),
            "--backward_passes_per_step",
            str(k),
            "--seed",
            str(seed),
            "--eval_every",
            str(every),
            "--n_eval_views",
            str(opts.n_eval_views),
            "--save_renders",
            "0",
            "--out_dir",
            str(out / run_name(seed, k, mode)),
            "--n_steps",
            str(opts.max_steps) if opts.max_steps > 0 else "100000000",
            *(["--time_budget_s", f"{share:.3f}"] if share > 0 else []),
        ]
        settings = parse_settings(
            flags, default_config=BASE_CONFIG if torch.cuda.is_available() else CPU_CONFIG
        )  # as train
        reached: list[float] = []

        def all_reached(step: int, psnr: float) -> bool:
            reached.append(psnr)
            return max(reached) >= targets[-1]

        result = run(settings, stop_after_eval=all_reached)
        if result.stopped:  # a signal (a scheduler's, a time limit's): this run is cut short, so it is left out
            stopped = f"K = {k}, seed {seed}, {mode}: stopped at step {result.step} ({result.stopped})"
            print(
                f"{stopped}; the {len(runs)} run(s) before it are written, the rest are not run",
                file=sys.stderr,
                flush=True,
            )
            break
        m = result.metrics
        where = {"scene": m["scene"], "device": m["device"]}
        timed_steps = max(m["steps"] - 1, 1)  # the first step (kernel compilation) is off the training clock
        seconds = m["train_seconds"]
        left = max(left - seconds, 0.0) if opts.budget_s > 0 else left
        curve = m["curve"]
        row = {
            "k": k,
            "seed": seed,
            "samples_per_step": int(round(m["samples_per_sec"] * seconds / timed_steps)),
            "step_ms": seconds / timed_steps * 1e3,
            "steps_to_psnr": {target_key(t): steps_to(curve, t) for t in targets},
            "final_psnr": float(curve[-1]["psnr"]),
            "sync": sync_of(m["communication"]),
            "lr_multiplier": m["communication"]["lr_multiplier"],
        }
        runs.append(row)
        details.append(
            {
                **row,
                "steps": m["steps"],
                "train_seconds": seconds,
                "share_s": share,
                "eval_every": every,
                "curve": curve,
            }
        )
        write_results(opts, runs, details, where, shared=False)
        print(
            f"K = {k}, seed {seed}, {mode}: {m['steps']} steps in {seconds:.1f} s, {row['step_ms']:.2f} ms/step, "
            f"targets {row['steps_to_psnr']}, final {row['final_psnr']:.2f} dB",
            file=sys.stderr,
            flush=True,
        )
    return runs, details, stopped, where


def in_parallel(
    opts: BatchOptions, extra: list[str], plan: list[tuple[int, int, str]]
) -> tuple[list[dict], list[dict], str | None, dict]:
    """``--parallel`` P: each run its own ``bench batch`` process, P at a time on the same device, each with
    ``--budget_s`` x P / runs training seconds; the rows in plan order, written whenever a run ends (with
    ``shared_device``). A run that fails is named with its log; the others still run."""
    out = Path(opts.out_dir)
    kids = out / "parallel"
    kids.mkdir(parents=True, exist_ok=True)
    share = opts.budget_s * min(opts.parallel, len(plan)) / len(plan) if opts.budget_s > 0 else 0.0
    done: dict[int, tuple[dict, dict]] = {}
    failed: list[str] = []
    where: dict[str, Any] = {}
    pending = list(enumerate(plan))
    running: dict[int, tuple[subprocess.Popen, str, IO[str]]] = {}

    def rows() -> tuple[list[dict], list[dict]]:
        order = sorted(done)
        return [done[i][0] for i in order], [done[i][1] for i in order]

    try:
        while pending or running:
            while pending and len(running) < opts.parallel:
                i, (seed, k, mode) = pending.pop(0)
                name = run_name(seed, k, mode)
                command = [
                    sys.executable, "-m", "hvd_ngp.bench", "batch", "--ks", str(k), "--seeds", str(seed),
                    "--modes", mode, "--psnr_targets", opts.psnr_targets, "--eval_every", str(opts.eval_every),
                    "--n_eval_views", str(opts.n_eval_views), "--budget_s", f"{share:.3f}",
                    "--max_steps", str(opts.max_steps), "--out_dir", str(out), "--json", str(kids / f"{name}.json"),
                    "--details_json", str(kids / f"{name}.details.json"), "--", *extra,
                ]  # fmt: skip
                log = open(kids / f"{name}.log", "w")
                running[i] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), name, log)
            time.sleep(0.2)
            for i in [i for i, (proc, _, _) in running.items() if proc.poll() is not None]:
                proc, name, sink = running.pop(i)
                sink.close()
                if proc.returncode != 0:
                    failed.append(f"{name}: exit {proc.returncode} (log: {kids / name}.log)")
                    print(f"bench batch --parallel: {failed[-1]}", file=sys.stderr, flush=True)
                    continue
                child = json.loads((kids / f"{name}.json").read_text())
                detail = json.loads((kids / f"{name}.details.json").read_text())["runs"][0]
                where = {"scene": child["scene"], "device": child["device"]}
                done[i] = (child["runs"][0], detail)
                write_results(opts, *rows(), where, shared=True)
                print(f"{name}: done ({len(done)} of {len(plan)})", file=sys.stderr, flush=True)
    finally:
        for proc, _, sink in running.values():  # interrupted: no run outlives the bench
            proc.terminate()
            proc.wait()
            sink.close()
    runs, details = rows()
    return runs, details, ("; ".join(failed) if failed else None), where
