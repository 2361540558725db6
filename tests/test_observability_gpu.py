"""Observability on real GPUs: NVML readings, the comm clock against queued GPU work, the doctor's
NCCL topology dump, and a training run whose metrics carry NVML figures. Skipped without a GPU
(HVD_NGP_REQUIRE_GPU=1 turns the skips into failures); the 2-rank tests need 2 GPUs."""

from __future__ import annotations

import json
import time

import pytest
import torch
from conftest import TINY_ARGS, gpu_or_skip, run_ranks

pytestmark = pytest.mark.gpu


def two_gpus_or_skip() -> None:
    gpu_or_skip()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")


def test_nvml_sampler_reads_this_gpu():
    gpu_or_skip()
    from hvd_ngp.observe.nvml import GpuSampler

    device = torch.device("cuda", 0)
    sampler = GpuSampler(device, period_s=0.05)
    assert sampler.available, sampler.why_unavailable
    assert sampler.uuid.removeprefix("GPU-") == str(torch.cuda.get_device_properties(0).uuid).removeprefix("GPU-")
    sampler.start()
    a = torch.randn(4096, 4096, device=device)
    end = time.monotonic() + 2.0
    while time.monotonic() < end:  # keep the GPU busy while the thread samples
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    reading = sampler.take()
    sampler.close()
    assert reading.samples >= 10
    assert 0 < reading.util_pct <= 100, reading
    assert reading.power_w is not None and reading.power_w > 10, reading
    assert reading.energy_j is not None and reading.energy_j > 0, reading
    total = torch.cuda.get_device_properties(0).total_memory
    assert (
        reading.mem_total_bytes == pytest.approx(total, rel=0.05)
        and 0 < reading.mem_used_bytes <= reading.mem_total_bytes
    )


def test_comm_clock_does_not_count_gpu_work_queued_before_the_collective():
    gpu_or_skip()
    from hvd_ngp.cluster.commclock import CommClock

    clock = CommClock()
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):  # about a second of queued work on an H200
        a = (a @ a).clamp_(-1, 1)
    with clock.blocking(a):  # the compute stream is drained before the timer starts
        pass
    queued = time.perf_counter() - start
    assert clock.calls == 1 and clock.seconds < 0.1 * queued, (clock.seconds, queued)


def test_doctor_on_two_gpus_checks_nccl_and_dumps_the_topology(tmp_path):
    two_gpus_or_skip()
    proc = run_ranks(
        [
            "-m",
            "hvd_ngp.observe.doctor",
            "--device",
            "cuda",
            "--dump-topology",
            str(tmp_path / "topo.xml"),
            "--json",
            str(tmp_path / "doctor.json"),
        ],
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "exact on every rank" in out and "busbw" in out and "hvd_ngp doctor: OK" in out, out[-4000:]
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert all("nccl" in rec["horovod_built"] for rec in report["records"]), report["records"]
    assert all(rec["driver"][0].isdigit() for rec in report["records"]), report["records"]
    xml = (tmp_path / "topo.xml").read_text()
    assert "<system" in xml and "<gpu" in xml, xml[:500]
    assert "topology: rank 0 (" in out and f"written {tmp_path / 'topo.xml'}" in out, out[-4000:]


def test_training_on_two_gpus_reports_nvml_figures(request, tmp_path):
    two_gpus_or_skip()
    scene_cache = request.getfixturevalue("scene_cache")  # only once the skip is decided: it takes a while
    proc = run_ranks(
        [
            "-m",
            "hvd_ngp.train",
            *TINY_ARGS,
            "--scene_cache",
            str(scene_cache),
            "--device",
            "cuda",
            "--out_dir",
            str(tmp_path / "out"),
            "--n_steps",
            "300",
            "--log_every",
            "100",
            "--target_samples",
            "65536",
        ],
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for r in records:
        assert r["gpus_measured"] == 2 and r["power_w"] > 20 and r["samples_per_joule"] > 0, r
        assert r["gpu_util"] is not None and r["gpu_util_min_rank"] in (0, 1), r
        assert 0 < r["gpu_mem_used_gib_max"] <= r["gpu_mem_total_gib"], r
        assert r["comm_fraction"] is not None and 0 <= r["comm_fraction"] <= 1, r
    assert log.count("GPU util n/a") == 0 and log.count(" W | ") >= 3, log[-3000:]
