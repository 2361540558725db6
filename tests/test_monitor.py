"""Live metrics in one process: the reduction's arithmetic, the line, NVML sampling (fake NVML),
the comm clock, metrics.jsonl and TensorBoard, Horovod tool options. Cross-rank facts: test_observability.py."""

from __future__ import annotations

import json
import math
import re
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ROOT
from fake_nvml import FakeNvml

from hvd_ngp.cluster import dist
from hvd_ngp.cluster.commclock import CommClock
from hvd_ngp.cluster.hvdtools import horovod_tool_env
from hvd_ngp.config import CPU_CONFIG, parse_args
from hvd_ngp.errors import ConfigError
from hvd_ngp.observe.monitor import (
    COL,
    JSONL_FIELDS,
    RANK_FIELDS,
    Monitor,
    MonitorSettings,
    format_line,
    interval_record,
    spread,
)
from hvd_ngp.observe.nvml import GpuSampler

GIB = float(1 << 30)


def table(rows: list[dict]) -> np.ndarray:
    """Rows of RANK_FIELDS values (missing: NaN) -> the reduced table [ranks, fields]."""
    return np.array([[row.get(f, math.nan) for f in RANK_FIELDS] for row in rows], dtype=np.float64)


def rank_row(**kw) -> dict:
    base = {
        "steps": 10,
        "rays": 1000,
        "samples": 50_000,
        "loss_sum": 0.5,
        "mse_sum": 0.01,
        "seconds": 2.0,
        "comm_seconds": 0.2,
    }
    return {**base, **kw}


def test_spread_ignores_unmeasured_ranks_and_breaks_ties_by_lowest_rank():
    s = spread(np.array([70.0, math.nan, 55.0, 90.0, 55.0]))
    assert (s.min, s.min_rank, s.max, s.max_rank, s.count) == (55.0, 2, 90.0, 3, 4)
    assert s.mean == pytest.approx(67.5) and s.total == pytest.approx(270.0)
    assert spread(np.array([math.nan, math.nan])) is None


def test_interval_record_totals_means_extremes_and_each_gpu_once():
    rows = [
        rank_row(gpu_util=90, gpu_mem_used=30 * GIB, gpu_mem_total=80 * GIB, gpu_power=400, gpu_energy=800, gpu_id=7),
        # rank 1 shares rank 0's GPU (same id): its power and energy must not be counted again
        rank_row(gpu_util=90, gpu_mem_used=30 * GIB, gpu_mem_total=80 * GIB, gpu_power=400, gpu_energy=800, gpu_id=7),
        rank_row(
            seconds=4.0,
            comm_seconds=0.0,
            gpu_util=60,
            gpu_mem_used=50 * GIB,
            gpu_mem_total=80 * GIB,
            gpu_power=300,
            gpu_energy=1200,
            gpu_id=9,
        ),
    ]
    rec = interval_record(table(rows), step=30, train_s=12.0, occupancy=0.25)
    assert set(rec) == set(JSONL_FIELDS)
    assert rec["interval_s"] == 4.0  # the slowest rank
    assert rec["samples"] == 150_000 and rec["samples_per_s"] == pytest.approx(150_000 / 4.0)
    assert rec["rank_samples_per_s_min"] == pytest.approx(12_500) and rec["rank_samples_per_s_min_rank"] == 2
    assert rec["rays_per_step"] == pytest.approx(300) and rec["samples_per_step"] == pytest.approx(15_000)
    assert rec["loss"] == pytest.approx(1.5 / 3 / 10)
    assert rec["train_psnr"] == pytest.approx(-10 * math.log10(0.03 / 3 / 10))
    assert rec["comm_fraction"] == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert (rec["comm_fraction_min"], rec["comm_fraction_min_rank"]) == (0.0, 2)
    assert rec["comm_fraction_max"] == pytest.approx(0.1) and rec["comm_fraction_max_rank"] == 0
    assert rec["gpu_util"] == pytest.approx(80) and (rec["gpu_util_min"], rec["gpu_util_min_rank"]) == (60, 2)
    assert (rec["gpu_util_max"], rec["gpu_util_max_rank"]) == (90, 0)
    assert rec["gpu_mem_used_gib_max"] == pytest.approx(50) and rec["gpu_mem_used_gib_max_rank"] == 2
    assert rec["gpu_mem_total_gib"] == pytest.approx(80)
    assert rec["gpus_measured"] == 2 and rec["power_w"] == pytest.approx(700)
    assert rec["energy_j"] == pytest.approx(2000) and rec["samples_per_joule"] == pytest.approx(75)
    json.dumps(rec, allow_nan=False)


def test_interval_record_without_gpus_or_comm_timing_says_null_not_nan():
    rec = interval_record(table([rank_row(comm_seconds=math.nan, mse_sum=0.0)]), step=5, train_s=1.0, occupancy=None)
    assert set(rec) == set(JSONL_FIELDS)
    for key in (
        "comm_fraction",
        "gpu_util",
        "gpu_util_min_rank",
        "gpu_mem_used_gib_max",
        "power_w",
        "energy_j",
        "samples_per_joule",
        "train_psnr",
    ):
        assert rec[key] is None, key
    assert rec["gpus_measured"] == 0
    json.dumps(rec, allow_nan=False)
    line = format_line(rec)
    for field in ("GPU util n/a", "GPU mem n/a", "comm n/a", "power n/a", "samples/J n/a"):
        assert field in line, line


def test_an_interval_with_nothing_counted_says_so():
    """The first log after a resume holds only the uncounted warm-up step: no zero rates, no infinite PSNR."""
    rec = interval_record(
        table([rank_row(steps=0, samples=0, rays=0, loss_sum=0.0, mse_sum=0.0)]), step=30, train_s=0.3, occupancy=None
    )
    assert format_line(rec) == "[step 30] nothing measured yet (the warm-up step is not counted) | 0.3 s"


def test_line_names_the_rank_with_the_lowest_utilisation():
    rows = [
        rank_row(gpu_util=u, gpu_power=600, gpu_energy=1200, gpu_id=r, gpu_mem_used=40 * GIB, gpu_mem_total=140 * GIB)
        for r, u in enumerate([93, 95, 92, 88])
    ]
    line = format_line(interval_record(table(rows), step=1200, train_s=60.0, occupancy=0.089))
    assert line.startswith("[step 1200] 0.100 M samples/s | GPU util 92% (min 88% rank 3) | GPU mem 40.0/140.0 GiB")
    assert (
        "| comm 10.0% | step spread 0% (slowest rank 0) | 2400 W | 41.7 samples/J | loss 0.05000 | train PSNR 30.00 |"
        in line
    ), line
    assert line.endswith("| 400 rays/step | occupied 8.9% | 60.0 s")


def test_gpu_sampler_averages_samples_and_reads_the_energy_counter():
    fake = FakeNvml(util=75, power_w=250, joules_per_read=5.0)
    sampler = GpuSampler(torch.device("cuda", 0), period_s=0.01, nvml=fake)
    assert sampler.available and fake.initialised
    # with a real GPU torch names it by UUID; without one the sampler falls back to the CUDA index
    assert sampler.uuid.startswith("GPU-") if torch.cuda.is_available() else sampler.uuid == "index-0"
    sampler.start()
    deadline = time.monotonic() + 30
    while fake.util_reads < 3 and time.monotonic() < deadline:  # the thread samples on its own
        time.sleep(0.01)
    reading = sampler.take()
    sampler.close()
    assert fake.util_reads >= 3 and reading.samples >= 3 and not fake.initialised
    assert reading.util_pct == 75 and reading.power_w == 250
    assert reading.mem_used_bytes == 2 << 30 and reading.mem_total_bytes == 16 << 30
    assert reading.energy_j == pytest.approx(5.0)  # counter read at begin() and at take(): one step of 5 J


def test_gpu_sampler_without_energy_counter_integrates_power():
    sampler = GpuSampler(torch.device("cuda", 0), period_s=60, nvml=FakeNvml(power_w=200, joules_per_read=None))
    sampler.begin()
    time.sleep(0.05)
    reading = sampler.take()
    assert reading.power_w == 200 and reading.energy_j == pytest.approx(200 * 0.05, rel=0.9)


def test_gpu_sampler_is_unavailable_on_cpu_with_a_reason():
    sampler = GpuSampler(torch.device("cpu"))
    sampler.start()
    reading = sampler.take()
    sampler.close()
    assert not sampler.available and sampler.why_unavailable == "no GPU"
    assert reading.util_pct is None and reading.power_w is None and reading.energy_j is None


def test_comm_clock_counts_only_what_it_wraps_and_can_be_switched_off():
    clock = CommClock()
    with clock.blocking(torch.zeros(3)):
        time.sleep(0.02)
    assert clock.calls == 1 and clock.seconds >= 0.02
    calls = []
    opt = SimpleNamespace(
        param_groups=[{"params": [torch.nn.Parameter(torch.zeros(2))]}], synchronize=lambda: calls.append(1)
    )
    clock.wrap_synchronize(opt)
    opt.synchronize()
    assert calls == [1] and clock.calls == 2
    clock.enabled = False
    before = clock.seconds
    with clock.blocking():
        time.sleep(0.01)
    opt.synchronize()
    assert clock.seconds == before and clock.calls == 2 and calls == [1, 1]


def settings(tmp_path, **kw) -> MonitorSettings:
    base = dict(
        jsonl=tmp_path / "m.jsonl",
        tensorboard=None,
        progress=False,
        comm_timing=True,
        gpu_sample_period_s=0.5,
        append=False,
    )
    return MonitorSettings(**{**base, **kw})


def fake_interval(monitor: Monitor, steps: int):
    stats = monitor.new_interval()
    for _ in range(steps):
        stats.add(torch.tensor(0.02), torch.tensor(0.01), 256, 4096)
        monitor.tick()
    return stats


def test_monitor_writes_complete_jsonl_and_tensorboard_scalars(tmp_path):
    dist.init("cpu")
    gpu = GpuSampler(torch.device("cuda", 0), period_s=0.05, nvml=FakeNvml(util=64, power_w=123))
    monitor = Monitor(settings(tmp_path, tensorboard=tmp_path / "tb"), total_steps=8, gpu=gpu)
    records = [
        monitor.end_interval(4 * (i + 1), fake_interval(monitor, 4), train_s=1.5 * (i + 1), occupancy=0.5)
        for i in range(2)
    ]
    monitor.close()
    for rec in records:
        assert list(rec) == list(JSONL_FIELDS)  # complete, in the documented order
        assert rec["world_size"] == dist.runtime().size and rec["interval_steps"] == 4
        assert rec["gpu_util"] == 64 and rec["power_w"] == pytest.approx(123 * rec["gpus_measured"])
        assert 0.0 <= rec["comm_fraction"] <= 1.0
    assert [r["step"] for r in records] == [4, 8] and [r["train_s"] for r in records] == [1.5, 3.0]
    if not dist.runtime().is_root:  # size-agnostic: only rank 0 writes
        assert not (tmp_path / "m.jsonl").exists() and not (tmp_path / "tb").exists()
        return
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == records

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "throughput/samples_per_s", "gpu/util_mean", "energy/power_w", "comm/fraction_mean"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == [4, 8]
    assert acc.Scalars("gpu/util_mean")[0].value == pytest.approx(64)


def test_pause_leaves_evaluation_out_of_the_interval(tmp_path):
    from hvd_ngp.cluster.commclock import COMM_CLOCK

    dist.init("cpu")
    gpu = GpuSampler(torch.device("cuda", 0), period_s=60, nvml=FakeNvml(joules_per_read=5.0))
    monitor = Monitor(settings(tmp_path, jsonl=None), total_steps=1, gpu=gpu)
    stats = fake_interval(monitor, 1)
    with monitor.paused():
        assert gpu.take().samples == 0  # the sampler is paused
        with COMM_CLOCK.blocking():
            time.sleep(0.05)  # an evaluation collective
    row = monitor.local_row(stats)
    monitor.close()
    assert row[COL["comm_seconds"]] < 0.05
    # energy counter read at begin, pause, resume and take (5 J each): the paused 5 J are left out
    assert row[COL["gpu_energy"]] == pytest.approx(10.0)


def test_monitoring_options_parse_and_validate(tmp_path, monkeypatch):
    args = parse_args(["--config", str(CPU_CONFIG), "--out_dir", str(tmp_path), "--progress", "off"])
    s = args.monitor
    assert s.jsonl == tmp_path / "metrics.jsonl" and s.tensorboard is None and not s.progress and s.comm_timing
    args = parse_args(
        [
            "--config",
            str(CPU_CONFIG),
            "--metrics_jsonl",
            "none",
            "--comm_timing",
            "off",
            "--timeline_file",
            "t.json",
            "--progress",
            "on",
        ]
    )
    s = args.monitor
    assert s.jsonl is None and not s.comm_timing and s.progress and args.timeline == "t.json"
    monkeypatch.setenv("HVD_NGP_STALL_CHECK_S", "5")
    assert parse_args(["--config", str(CPU_CONFIG)]).stall_check_s == 5
    with pytest.raises(ConfigError, match="gpu_sample_period_s must be positive"):
        parse_args(["--config", str(CPU_CONFIG), "--gpu_sample_period_s", "0"])


def test_horovod_tool_options_become_horovod_variables(tmp_path):
    env = horovod_tool_env(
        timeline=str(tmp_path / "tl.json"),
        timeline_mark_cycles=True,
        autotune_log=str(tmp_path / "at.csv"),
        stall_check_s=10,
        stall_shutdown_s=30,
    )
    assert env == {
        "HOROVOD_TIMELINE": str(tmp_path / "tl.json"),
        "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": str(tmp_path / "at.csv"),
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "10",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
    }
    assert horovod_tool_env() == {}
    assert horovod_tool_env(autotune=True) == {"HOROVOD_AUTOTUNE": "1"}
    assert horovod_tool_env(stall_check_s=0) == {"HOROVOD_STALL_CHECK_DISABLE": "1"}
    horovod_tool_env(timeline=str(tmp_path / "new" / "tl.json"))  # a missing folder is made
    assert (tmp_path / "new").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot create the folder .*file/sub"):
        horovod_tool_env(timeline=str(tmp_path / "file" / "sub" / "tl.json"))
    with pytest.raises(ConfigError, match="--stall_shutdown_s 5 needs the stall check on"):
        horovod_tool_env(stall_check_s=10, stall_shutdown_s=5)
    with pytest.raises(ConfigError, match="needs --timeline"):
        horovod_tool_env(timeline_mark_cycles=True)


def test_monitoring_page_documents_every_jsonl_field():
    """docs/monitoring.md's metrics.jsonl table has one row per field, in the records' order."""
    page = (ROOT / "docs" / "monitoring.md").read_text()
    section = page.split("\n## metrics.jsonl", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.M)
    missing = [name for name in JSONL_FIELDS if name not in rows]
    assert not missing, f"docs/monitoring.md lacks metrics.jsonl field(s): {missing}"
    assert [r for r in rows if r in JSONL_FIELDS] == list(JSONL_FIELDS), "the table's order differs from the records'"
    assert set(COL) == set(RANK_FIELDS)
