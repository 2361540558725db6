"""``python -m hvd_ngp.bench syncmodes``: the quality cost of ``--grad_sync delayed | periodic`` at equal samples.

    python -m hvd_ngp.bench syncmodes --ranks 2,4 --seeds 1337,1 -- --n_steps 300

For each rank count, mode and seed: one ``horovodrun -np N -H localhost:N`` training run (the same trainer
flags, steps and samples per rank for every mode), its final test PSNR. Prints a table (PSNR per seed, the
mean, and the mean's difference from ``every`` at the same rank count) and writes JSON. On the CPU by
default (``--device cpu``, the built-in scene); ``--controller`` picks Gloo or MPI. The mode ``delayed_grid+fp16``
is ``--grad_sync delayed_grid --compression fp16`` (the late grid gradient on the fp16 wire); ``+comp`` adds
``--delay_compensation local`` (``delayed_grid+comp``, ``delayed_grid+fp16+comp``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..cluster.comm import GRAD_SYNCS
from ..errors import HvdNgpError
from ..options import options_from
from .report import comma_list, table, write_json


class BenchError(HvdNgpError):
    """A training run of the benchmark failed."""


#: benchmark modes beyond ``--grad_sync``'s own names -> their trainer flags
COMBINED_MODES = {
    "delayed_grid+fp16": ["--grad_sync", "delayed_grid", "--compression", "fp16"],
    "delayed_grid+comp": ["--grad_sync", "delayed_grid", "--delay_compensation", "local"],
    "delayed_grid+fp16+comp": ["--grad_sync", "delayed_grid", "--compression", "fp16", "--delay_compensation", "local"],
}
MODES = (*GRAD_SYNCS, *COMBINED_MODES)


def mode_flags(mode: str) -> list[str]:
    """The trainer flags of a benchmark mode (``every``, ..., ``delayed_grid+fp16``)."""
    return COMBINED_MODES.get(mode, ["--grad_sync", mode])


def _ints(text: str, what: str) -> list[int]:
    return comma_list(text, int, what, BenchError)


@dataclass(frozen=True)
class SyncModesOptions:
    """The command line of ``python -m hvd_ngp.bench syncmodes`` (``main``'s parser holds each option's help)."""

    ranks: str
    modes: str
    seeds: str
    sync_period: int
    device: str
    controller: str
    out_dir: str
    json: str | None
    extra: list[str]  # trainer flags


def train_once(ranks: int, mode: str, seed: int, opts: SyncModesOptions, out: Path) -> dict:
    """One launch -> {"psnr", "steps", "train_seconds"}; a failed run raises ``BenchError`` with its log's tail."""
    metrics = out / "metrics.json"
    beside = Path(sys.executable).with_name("horovodrun")  # the venv's; else the PATH's (a --target install)
    launcher = beside if beside.is_file() else Path(shutil.which("horovodrun") or beside)
    cmd = [
        str(launcher),
        "-np",
        str(ranks),
        "-H",
        f"localhost:{ranks}",
        f"--{opts.controller}",
        sys.executable,
        "-m",
        "hvd_ngp.train",
        "--device",
        opts.device,
        *mode_flags(mode),
        "--seed",
        str(seed),
        "--out_dir",
        str(out),
        "--metrics_json",
        str(metrics),
        "--save_renders",
        "0",
        *(["--sync_period", str(opts.sync_period)] if mode == "periodic" else []),
        *opts.extra,
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (out / "log.txt").parent.mkdir(parents=True, exist_ok=True)
    (out / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not metrics.is_file():
        raise BenchError(
            f"{ranks} ranks, {' '.join(mode_flags(mode))}, seed {seed} failed (exit {proc.returncode}); "
            f"log {out / 'log.txt'}: {(proc.stdout + proc.stderr)[-600:]}"
        )
    m = json.loads(metrics.read_text())
    return {
        "psnr": m["test_psnr"],
        "steps": m["steps"],
        "train_seconds": m["train_seconds"],
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m hvd_ngp.bench syncmodes", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2", help="comma-separated rank counts (all on this machine)")
    p.add_argument(
        "--modes",
        default=",".join(GRAD_SYNCS),
        help=f"comma-separated of {', '.join(MODES)} (delayed_grid+fp16: with --compression fp16; +comp: with "
        "--delay_compensation local)",
    )
    p.add_argument("--seeds", default="1337,1")
    p.add_argument("--sync_period", type=int, default=8, help="H of --grad_sync periodic")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--controller", choices=("gloo", "mpi"), default="gloo")
    p.add_argument("--out_dir", default="runs/bench/syncmodes")
    p.add_argument("--json", default=None, help="summary JSON (default <out_dir>/syncmodes.json)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after '--': trainer flags for every run")
    opts = options_from(SyncModesOptions, p.parse_args(argv))
    opts = replace(opts, extra=[a for a in opts.extra if a != "--"])
    ranks, seeds = _ints(opts.ranks, "ranks"), _ints(opts.seeds, "seeds")
    modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise BenchError(f"--modes: unknown {unknown} (known: {', '.join(MODES)})")
    out = Path(opts.out_dir)
    runs = []
    for n in ranks:
        for mode in modes:
            for seed in seeds:
                r = train_once(n, mode, seed, opts, out / f"np{n}_{mode}_seed{seed}")
                runs.append({"ranks": n, "mode": mode, "seed": seed, **r})
                print(
                    f"{n} ranks, {mode}, seed {seed}: {r['psnr']:.3f} dB ({r['steps']} steps, {r['wall_seconds']} s)",
                    file=sys.stderr,
                    flush=True,
                )
    rows = []
    for n in ranks:
        base = None
        for mode in modes:
            mine = [r for r in runs if r["ranks"] == n and r["mode"] == mode]
            mean = sum(r["psnr"] for r in mine) / len(mine)
            base = mean if mode == "every" else base
            rows.append(
                {
                    "ranks": n,
                    "mode": mode + (f" (H {opts.sync_period})" if mode == "periodic" else ""),
                    **{f"seed {r['seed']} dB": f"{r['psnr']:.3f}" for r in mine},
                    "mean dB": f"{mean:.3f}",
                    "vs every": "" if base is None or mode == "every" else f"{mean - base:+.3f}",
                }
            )
    print(table(rows, list(rows[0])))
    result = {
        "ranks": ranks,
        "modes": modes,
        "seeds": seeds,
        "sync_period": opts.sync_period,
        "controller": opts.controller,
        "trainer_flags": opts.extra,
        "runs": runs,
    }
    write_json(opts.json or out / "syncmodes.json", result)
    return result
