"""``python -m hvd_ngp.bench``: dispatch, the scaling summary, and ``scaling`` end to end at 1 and 2 CPU ranks."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, TINY_ARGS, TINY_ENCODING

from hvd_ngp.bench.__main__ import available
from hvd_ngp.bench._scaling_rank import interval_mean, steady_step_seconds, steady_throughput
from hvd_ngp.bench.scaling import BenchError, per_rank_samples, rank_counts, summarize, time_to
from hvd_ngp.bench.throughput import (
    WINDOW,
    ProfEvent,
    busy_share,
    host_profile,
    kernel_timeline,
    launch_sources,
    outermost_aten_ops,
    step_profile,
)


def bench(*args: str, timeout: float = 120, interpreter: bool = True) -> subprocess.CompletedProcess:
    """``python -m hvd_ngp.bench ARGS``; ``interpreter=False``: without the Triton interpreter the test session
    turned on, as a CPU user runs it (no Triton rows, which would time the interpreter)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not interpreter:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run(
        [sys.executable, "-m", "hvd_ngp.bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_dispatch():
    assert "scaling" in available() and not any(n.startswith("_") for n in available())
    for name in available():  # each one the dispatcher offers can run (python -m hvd_ngp.bench NAME)
        assert callable(getattr(importlib.import_module(f"hvd_ngp.bench.{name}"), "main", None)), name
    proc = bench("nope")
    assert proc.returncode == 2 and "usage: python -m hvd_ngp.bench {" in proc.stderr and "scaling" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert bench("--help").returncode == 0


def test_summary_arithmetic():
    assert time_to([(1.0, 20.0), (2.0, 33.5), (3.0, 36.0)], 33) == 2.0
    assert time_to([(1.0, 20.0)], 33) is None
    # intervals after the first: (10 - 4) s at 2.0 and (16 - 10) s at 4.0 samples/s
    history = [
        {"seconds": 4.0, "samples_per_sec": 1.0},
        {"seconds": 10.0, "samples_per_sec": 2.0},
        {"seconds": 16.0, "samples_per_sec": 4.0},
    ]
    assert steady_throughput(history) == pytest.approx(3.0)
    assert steady_throughput(history[:1]) == pytest.approx(1.0)
    monitored = [{"interval_s": 1.0, "comm_fraction": 0.1}, {"interval_s": 3.0, "comm_fraction": 0.3}]
    assert interval_mean(monitored, "comm_fraction") == pytest.approx(0.25)
    assert interval_mean([*monitored, {"interval_s": 1.0, "comm_fraction": None}], "comm_fraction") is None
    assert rank_counts("4,1,2", None) == [1, 2, 4] and rank_counts("auto", 6) == [1, 2, 4]

    def run(n, rate):
        return {
            "ranks": n,
            "nodes": 1,
            "steady_samples_per_sec": rate,
            "gpu_util_percent": None,
            "comm_share": 0.1,
            "samples_per_joule": None,
            "test_psnr": 30.0,
            "psnr_curve": [(5.0, 33.1)],
            "ceiling": [],
        }

    rows = summarize([run(1, 100.0), run(2, 190.0)], [33.0, 35.0])
    assert rows[1]["speedup"] == pytest.approx(1.9) and rows[1]["efficiency"] == pytest.approx(0.95)
    assert rows[1]["time_to_psnr"] == {"33.0": 5.0, "35.0": None}
    # without a 1-rank run, speedup is counted from the smallest run's per-rank rate
    rows = summarize([run(2, 200.0), run(4, 360.0)], [33.0])
    assert rows[0]["speedup"] == pytest.approx(2.0) and rows[1]["efficiency"] == pytest.approx(0.9)
    assert [r["mode"] for r in rows] == ["weak", "weak"]


def test_strong_scaling_arithmetic():
    history = [{"step": 10, "seconds": 4.0}, {"step": 20, "seconds": 6.0}, {"step": 40, "seconds": 10.0}]
    assert steady_step_seconds(history) == pytest.approx(0.2)  # after the first interval: 6 s / 30 steps
    assert steady_step_seconds(history[:1]) == pytest.approx(0.4) and steady_step_seconds([]) is None
    assert per_rank_samples("weak", 1024, 4) == 1024 and per_rank_samples("strong", 1024, 4) == 256
    with pytest.raises(BenchError, match="--target_samples 1000 .* 3 rank"):
        per_rank_samples("strong", 1000, 3)

    def run(mode, n, step_s, rate):
        return {
            "mode": mode,
            "ranks": n,
            "nodes": 1,
            "target_samples": 1024 // n,
            "steady_step_s": step_s,
            "steady_samples_per_sec": rate,
            "gpu_util_percent": None,
            "comm_share": 0.1,
            "samples_per_joule": None,
            "test_psnr": 30.0,
            "psnr_curve": [(5.0, 33.1)],
            "ceiling": [],
        }

    # strong: speedup from seconds per step (0.4 s -> 0.25 s), not from throughput; weak rows keep theirs
    rows = summarize(
        [
            run("weak", 1, 0.4, 100.0),
            run("weak", 2, 0.5, 160.0),
            run("strong", 1, 0.4, 100.0),
            run("strong", 2, 0.25, 150.0),
        ],
        [33.0],
    )
    assert [(r["mode"], r["ranks"]) for r in rows] == [("weak", 1), ("weak", 2), ("strong", 1), ("strong", 2)]
    assert rows[1]["speedup"] == pytest.approx(1.6) and rows[2]["speedup"] == pytest.approx(1.0)
    assert rows[3]["speedup"] == pytest.approx(1.6) and rows[3]["efficiency"] == pytest.approx(0.8)
    assert rows[3]["samples_per_rank_step"] == 512 and rows[3]["time_to_psnr"] == {"33.0": 5.0}
    # from 2 ranks: the smallest run counts as 2x
    rows = summarize([run("strong", 2, 0.3, 1.0), run("strong", 4, 0.2, 1.0)], [])
    assert rows[1]["speedup"] == pytest.approx(3.0) and rows[1]["efficiency"] == pytest.approx(0.75)


@pytest.mark.parallel
def test_scaling_end_to_end_on_cpu(scene_cache, tmp_path):
    """bench scaling --mode both on 1 and 2 CPU ranks: weak (1024 samples per rank) and strong (1024 over both
    ranks: 512 each) from three runs (one rank serves both), the allreduce ceiling and sharded update at 2 ranks,
    the table and the dated markdown section."""
    markdown = tmp_path / "BENCHMARKS.md"
    proc = bench(
        "scaling",
        "--mode",
        "both",
        "--ranks",
        "1,2",
        "--ceiling_repeats",
        "3",
        "--psnr_targets",
        "10,35",
        "--out_dir",
        str(tmp_path / "runs"),
        "--markdown",
        str(markdown),
        "--",
        *TINY_ARGS,
        "--scene_cache",
        str(scene_cache),
        "--n_steps",
        "20",
        "--log_every",
        "5",
        "--eval_every",
        "10",
        "--device",
        "cpu",
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((tmp_path / "runs" / "scaling.json").read_text())
    rows = summary["rows"]
    assert [(r["mode"], r["ranks"]) for r in rows] == [("weak", 1), ("weak", 2), ("strong", 1), ("strong", 2)]
    one, two, _, strong = rows
    assert one["speedup"] == pytest.approx(1.0) and one["samples_per_sec"] > 0 and two["samples_per_sec"] > 0
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert one["comm_share"] == 0 and 0 < two["comm_share"] < 1  # only 2 ranks wait for allreduces
    assert one["gpu_util_percent"] is None and one["samples_per_joule"] is None  # CPU: n/a
    assert one["time_to_psnr"]["35.0"] is None  # honestly not reached
    assert one["samples_per_rank_step"] == two["samples_per_rank_step"] == 1024
    # strong: what each run parsed (its own result file), not what the bench meant to pass; one rank ran once
    used = {
        n: json.loads((tmp_path / "runs" / d / "result.json").read_text())["target_samples"]
        for n, d in ((1, "ranks1"), (2, "strong-ranks2"))
    }
    assert used == {1: 1024, 2: 512} and not (tmp_path / "runs" / "strong-ranks1").exists()
    assert [(r["mode"], r["ranks"], r["target_samples"]) for r in summary["runs"]] == [
        ("weak", 1, 1024),
        ("weak", 2, 1024),
        ("strong", 1, 1024),
        ("strong", 2, 512),
    ]
    assert strong["speedup"] == pytest.approx(rows[2]["step_s"] / strong["step_s"]) and strong["step_s"] > 0
    assert strong["efficiency"] == pytest.approx(strong["speedup"] / 2)
    weak_two, strong_two = summary["runs"][1], summary["runs"][3]
    ceiling = weak_two["ceiling"]
    assert [c["tensor"].split(" (")[0] for c in ceiling] == ["hash grid", "all gradients"]
    assert all(c["backend"] == "gloo" and c["horovod_s"] > 0 and c["raw_s"] > 0 for c in ceiling)
    assert summary["runs"][0]["ceiling"] == [] and strong_two["ceiling"]  # nothing to reduce at 1 rank
    # a sharded Adam update (reduce-scatter, 1/2 of the values each, all-gather) gives the allreduced one's values
    update = weak_two["update"]
    assert update["max_difference"] < 1e-5 and update["allreduce_update_s"] > 0 and update["sharded_update_s"] > 0
    assert update["values"] % 2 == 0 and summary["runs"][0]["update"] is None
    # the table printed, and the dated section with the command
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| mode"))
    assert [c.strip() for c in header.strip("|").split("|")][:8] == [
        "mode",
        "ranks",
        "nodes",
        "samples/rank/step",
        "ms/step",
        "M samples/s",
        "speedup",
        "efficiency",
    ]
    assert "time to 10 dB" in header and "time to 35 dB" in header
    assert re.search(r"^\| weak +\| 2 +\| [\d.]+ +\| [\d.]+ ms +\| [\d.]+ ms +\| [\d.]+x +\| ", proc.stdout, re.M)
    assert re.search(
        r"^\| weak +\| 2 +\| 1 +\| 1024 +\| [\d.]+ +\| [\d.]+ +\| [\d.]+x +\| [\d.]+% +\| n/a +\| "
        r"[\d.]+% +\| n/a",
        proc.stdout,
        re.M,
    ), proc.stdout
    assert re.search(r"^\| strong +\| 2 +\| 1 +\| 512 +\|", proc.stdout, re.M), proc.stdout
    text = markdown.read_text()
    assert text.startswith("# Benchmarks") and re.search(r"^## Scaling \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\)$", text, re.M)
    assert "`python -m hvd_ngp.bench scaling --mode both --ranks 1,2" in text and "| not reached " in text
    assert "weak and strong scaling (1024 samples per step per rank, and over all ranks)" in text, text
    assert "average, flat allreduce, lr x" in text, text  # one host: no hierarchical allreduce
    assert re.search(r"^\| weak +\| 2 +\| hash grid \(encoding.params\) +\|", text, re.M), text


def test_memory_bench_gives_the_same_psnr_under_every_budget(tmp_path, scene_cache):
    out = tmp_path / "memory.json"
    proc = bench(
        "memory",
        "--device",
        "cpu",
        "--n_steps",
        "8",
        "--budgets",
        "0,0.05",
        "--eval_views",
        "1",
        "--json",
        str(out),
        "--markdown",
        "",
        "--",
        *TINY_ARGS,
        "--scene_cache",
        str(scene_cache),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["budget_gb"] for r in runs] == [0.0, 0.05] and runs[1]["budget_gib"] == pytest.approx(0.05)
    assert runs[0]["psnr"] == pytest.approx(runs[1]["psnr"], abs=1e-6) and "| views/s |" in proc.stdout


def test_launch_and_busy_arithmetic():
    assert busy_share([(0, 10), (5, 20), (30, 40)], 0, 100) == pytest.approx(0.30)  # union, not sum
    assert busy_share([(-5, 5), (95, 150)], 0, 100) == pytest.approx(0.10)  # clipped to the window
    assert busy_share([], 0, 100) == 0.0
    ev = lambda name, act, t0, t1, thread=1: ProfEvent(name, act, thread, t0, t1)  # noqa: E731
    # aten::add nests aten::empty (not counted); autograd's MmBackward0 dispatches aten::mm on another thread
    ops = [
        ev("aten::add", "cpu_op", 0, 10),
        ev("aten::empty", "cpu_op", 2, 3),
        ev("aten::mul", "cpu_op", 10, 12),
        ev("MmBackward0", "cpu_op", 0, 9, thread=2),
        ev("aten::mm", "cpu_op", 1, 8, thread=2),
    ]
    assert outermost_aten_ops(ops) == 3
    cuda = [
        ev(WINDOW, "user_annotation", 100, 200),
        ev(WINDOW, "gpu_user_annotation", 105, 199),
        ev(WINDOW, "kernel", 105, 199),  # the same mirror as torch 2.11's events classify it
        ev("cudaLaunchKernel", "cuda_runtime", 110, 111),
        ev("cuLaunchKernel_v7000", "cuda_driver", 120, 121),
        ev("cudaGraphLaunch", "cuda_runtime", 130, 131),
        ev("cudaLaunchKernel", "cuda_runtime", 50, 51),
        ev("cudaMemcpyAsync", "cuda_runtime", 140, 141),
        ev("k1", "kernel", 112, 150),
        ev("k2", "kernel", 140, 160),
        ev("Memcpy HtoD", "gpu_memcpy", 160, 190),
        ev("k0", "kernel", 60, 70),
        *[e._replace(start_ns=e.start_ns + 100, end_ns=e.end_ns + 100) for e in ops],
        # a host range and its GPU mirror, which torch 2.11's events call a kernel: neither is one
        ev("Optimizer.step#Adam.step", "cpu_op", 170, 180),
        ev("Optimizer.step#Adam.step", "kernel", 110, 199),
    ]
    prof = step_profile(cuda, 2, cuda=True)
    assert prof["launches_per_step"] == 1.5 and prof["kernels_per_step"] == 1.0  # only inside the window
    assert prof["gpu_busy_share"] == pytest.approx(0.48) and prof["aten_ops_per_step"] == 1.5
    assert prof["profiled_step_ms"] == pytest.approx(50e-6)
    assert list(prof["kernel_ms"]) == ["k1", "k2"]  # k0 is outside the window; memcpys are not kernels
    assert prof["kernel_ms"]["k1"] == pytest.approx(19e-6) and prof["kernel_ms"]["k2"] == pytest.approx(10e-6)
    # one launch from inside aten::mul, one direct driver call with no kernel matched, one graph replay
    assert prof["launch_sources"] == {"CUDA graph replay": 0.5, "aten::mul": 0.5, "cuLaunchKernel": 0.5}
    on_cpu = step_profile(cuda, 2, cuda=False)
    assert on_cpu["launch_sources"] == {}
    assert (
        on_cpu["launches_per_step"] is None and on_cpu["gpu_busy_share"] is None and on_cpu["aten_ops_per_step"] == 1.5
    )
    assert on_cpu["kernel_ms"] == {}
    with pytest.raises(RuntimeError, match="expected one"):
        step_profile(cuda[1:], 2, cuda=True)


def test_kernel_timeline_orders_kernels_and_counts_idle_gaps():
    ev = lambda name, t0, t1: ProfEvent(name, "kernel", 1, t0, t1)  # noqa: E731
    # over 2 steps: a 5 us kernel, overlapping long one, 2 us of idle, then a wait of 40 us for the host
    kernels = [
        ev("b", 10_000, 15_000),
        ev("a", 0, 12_000),
        ev("c", 14_000, 30_000),
        ev("d", 32_000, 34_000),
        ev("e", 74_000, 94_000),
    ]
    out = kernel_timeline(kernels, n_steps=2)
    assert [row[0] for row in out["kernel_timeline"]] == ["a", "b", "c", "d", "e"]
    assert out["kernel_timeline"][3] == ["d", 2.0, 2.0] and out["kernel_timeline"][4] == ["e", 40.0, 20.0]
    gaps = out["kernel_gaps"]
    assert gaps["idle_ms_per_step"] == pytest.approx(0.021)  # (2 + 40) us over 2 steps
    assert gaps["short_kernels_per_step"] == 1.0 and gaps["short_kernel_ms_per_step"] == pytest.approx(0.0035)
    assert gaps["idle_us_before_per_step"] == {"e": 20.0}  # only the gap over 20 us


def test_launch_sources_name_the_host_code_behind_each_launch():
    ev = lambda name, act, t0, t1, thread=1, corr=0: ProfEvent(name, act, thread, t0, t1, corr)  # noqa: E731
    events = [
        ev("Optimizer.step#Adam.step", "user_annotation", 0, 50),
        ev("aten::_foreach_add_", "cpu_op", 5, 20),
        ev("cudaLaunchKernel", "cuda_runtime", 6, 7, corr=1),
        ev("cudaLaunchKernel", "cuda_runtime", 8, 9, corr=2),
        ev("aten::copy_", "cpu_op", 60, 70),
        ev("cudaMemcpyAsync", "cuda_runtime", 61, 62, corr=3),  # not a launch
        ev("cudaLaunchKernel", "cuda_runtime", 63, 64, corr=4),
        ev("cuLaunchKernel", "cuda_driver", 80, 81, corr=5),
        ev("_march", "kernel", 82, 90, corr=5),  # Triton
        ev("cuLaunchKernel", "cuda_driver", 91, 92, corr=6),  # no kernel event matched: the call's name
        ev("cudaGraphLaunch", "cuda_runtime", 100, 101, corr=7),
        ev("k_in_graph", "kernel", 102, 110, corr=7),
        ev("aten::copy_", "cpu_op", 200, 210, thread=2),
        ev("cudaLaunchKernel", "cuda_runtime", 201, 202, thread=2),
        ev("cudaLaunchKernel", "cuda_runtime", 300, 301, thread=3, corr=8),  # no host range on its thread
        ev("elementwise_kernel", "kernel", 302, 303, corr=8),
    ]
    assert launch_sources(events, 2) == {
        "Optimizer.step#Adam.step": 1.0,  # the outermost range, not the aten op inside it
        "aten::copy_": 1.0,  # one per thread: ranges are matched on the launch's own thread
        "CUDA graph replay": 0.5,
        "_march (direct launch)": 0.5,
        "cuLaunchKernel": 0.5,
        "elementwise_kernel (direct launch)": 0.5,
    }


def _slow_host_work(n: int) -> int:
    total = 0
    for k in range(n):  # pure Python: all of it is this function's self time
        total += k
    return total


def test_host_profile_ranks_the_host_functions_by_self_time_per_step():
    calls = []

    def step(i):
        calls.append(i)
        _slow_host_work(200_000)
        sum(range(100))

    prof = host_profile(step, 3, top=4)
    assert calls == [0, 1, 2] and len(prof) <= 4
    name, ms = next(iter(prof.items()))  # the costliest first, in ms per step
    assert "(_slow_host_work)" in name and name.startswith("test_bench.py:") and ms > 0.5
    assert ms > 10 * max(v for k, v in prof.items() if "(sum)" in k or "built-in method builtins.sum" in k)
    assert list(prof.values()) == sorted(prof.values(), reverse=True)
    assert host_profile(step, 0) == {} and calls == [0, 1, 2]


def test_throughput_bench_reports_launches_and_busy_share_on_cpu(tmp_path, scene_cache):
    out = tmp_path / "throughput.json"
    proc = bench(
        "throughput",
        "--device",
        "cpu",
        "--backends",
        "torch",
        "--warmup_steps",
        "2",
        "--steps",
        "1",
        "--profile_steps",
        "2",
        "--host_profile_steps",
        "2",
        "--points",
        "256",
        "--repeat",
        "1",
        "--no_compile",
        "--json",
        str(out),
        "--markdown",
        "",
        "--",
        *TINY_ARGS,
        "--scene_cache",
        str(scene_cache),
        timeout=300,
        interpreter=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["training"]
    assert run["profiled_steps"] == 2 and run["profiled_step_ms"] > 0
    assert run["launches_per_step"] is None and run["kernels_per_step"] is None and run["gpu_busy_share"] is None
    assert run["launch_sources"] == {}  # no launches on the CPU, so no launch-source table
    assert 0 < len(run["host_self_ms"]) <= 15 and all(ms >= 0 for ms in run["host_self_ms"].values())
    assert "costliest functions over 2 steps under cProfile" in proc.stdout
    assert run["aten_ops_per_step"] > 50  # a NeRF step dispatches hundreds of operators
    assert run["samples_per_sec"] > 0 and "backward" in run["stages_ms"]  # the existing fields stay
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| backend"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "backend",
        "precision",
        "M samples/s",
        "vs torch",
        "step ms",
        "samples/step",
        "rays/step",
        "peak GiB",
        "launches/step",
        "GPU busy",
        "aten ops/step",
    ]
    assert re.search(r"^\| torch +\| fp32 .*\| n/a +\| n/a +\| n/a +\| \d+ +\|$", proc.stdout, re.M), proc.stdout


def test_throughput_bench_applies_triton_only_encoding_options_to_its_triton_builds_only(scene_cache):
    """``bench throughput --backends triton -- --encoding '{"merge_runs_below": 300}'`` on a GPU failed with
    "merge_runs_below needs the triton backend (got torch)": the MLP micro-benchmark builds a torch reference
    field beside the triton one. The bench's torch-side builds (that reference, a torch training run, the scaling
    bench's parameter count) take the grid without the Triton kernels' options; the trainer keeps the error."""
    import torch

    from hvd_ngp.bench._scaling_rank import gradient_sizes
    from hvd_ngp.bench.throughput import ThroughputOptions, bench_mlp, bench_training, trainer_settings
    from hvd_ngp.errors import ConfigError
    from hvd_ngp.model.field import NGPField

    kernel = json.dumps(
        {**json.loads(TINY_ENCODING), "table_dtype": "float16", "vector_atomics": True, "merge_runs_below": 300}
    )
    opts = ThroughputOptions(
        scene="builtin",
        config=None,
        backends="torch",
        device="cpu",
        precision="auto",
        target_samples=1024,
        warmup_steps=1,
        steps=1,
        profile_steps=0,
        host_profile_steps=0,
        eval_views=0,
        points=64,
        repeat=1,
        no_compile=True,
        march_launches=False,
        grid_launches=False,
        inference_size=0,  # no inference rows (tests/test_infer.py covers them)
        inference_repeat=1,
        inference_windows="",
        seed=0,
        json="",
        markdown="",
        extra=[*TINY_ARGS, "--encoding", kernel, "--scene_cache", str(scene_cache)],
    )
    model = trainer_settings(opts, "torch").model.blocks
    assert model["encoding"]["merge_runs_below"] == 300 and model["encoding"]["n_levels"] == 4
    with pytest.raises(ConfigError, match="needs the triton backend"):  # what a user's --backend torch still gets
        NGPField(model, torch.tensor([[0.0] * 3, [1.0] * 3]), "torch")
    rows = bench_mlp(opts, model, torch.device("cpu"))
    assert [r["implementation"] for r in rows] == ["torch eager fp32", "torch eager fp16 autocast"]
    assert sum(gradient_sizes(model).values()) > 0
    run = bench_training(opts, "torch")
    assert run["backend"] == "torch" and run["samples_per_sec"] > 0


def test_syncmodes_runs_delayed_grid_fp16_as_its_two_flags(tmp_path, monkeypatch):
    """``bench syncmodes --modes delayed_grid+fp16`` launches the trainer with ``--grad_sync delayed_grid
    --compression fp16`` (the launch is faked: it records the command and writes the metrics); unknown modes fail."""
    from hvd_ngp.bench import syncmodes

    launched = []

    def fake_run(cmd, **_):
        launched.append(cmd)
        out = cmd[cmd.index("--metrics_json") + 1]
        psnr = 20.0 if "--compression" in cmd else 21.0
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as fh:
            json.dump({"test_psnr": psnr, "steps": 3, "train_seconds": 0.1}, fh)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(syncmodes.subprocess, "run", fake_run)
    result = syncmodes.main(["--modes", "every,delayed_grid+fp16", "--seeds", "1", "--out_dir", str(tmp_path)])
    every, wire = launched
    assert "--compression" not in every and every[every.index("--grad_sync") + 1] == "every"
    assert wire[wire.index("--grad_sync") + 1 : wire.index("--grad_sync") + 4] == [
        "delayed_grid",
        "--compression",
        "fp16",
    ]
    assert [r["mode"] for r in result["runs"]] == ["every", "delayed_grid+fp16"]
    with pytest.raises(syncmodes.BenchError, match=r"unknown \['delayed\+fp16'\].*delayed_grid\+fp16"):
        syncmodes.main(["--modes", "delayed+fp16", "--out_dir", str(tmp_path)])
