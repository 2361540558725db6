"""Run under ``horovodrun -np N`` (N >= 2): the live metrics' reduction across real ranks.

    python tests/parallel/check_monitor.py OUT_DIR

1. known per-rank rows -> ONE collective -> every rank holds the same table, and the record's
   totals, means, minima/maxima and the ranks that hold them are right;
2. the whole Monitor with a fake NVML whose utilisation differs by rank: the line names the rank
   with the lowest utilisation, each GPU's power counts once;
3. the communication share: the last rank sleeps before every collective, so the others wait in
   it: their comm share is high, the sleeper's is the lowest.
Prints ``CHECK <name> OK`` lines on rank 0; any failure raises (non-zero exit).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fake_nvml import FakeNvml  # noqa: E402

from hvd_ngp.cluster import dist  # noqa: E402
from hvd_ngp.cluster.commclock import COMM_CLOCK  # noqa: E402
from hvd_ngp.observe.monitor import (  # noqa: E402
    JSONL_FIELDS,
    RANK_FIELDS,
    Monitor,
    MonitorSettings,
    format_line,
    gather_rows,
    interval_record,
)
from hvd_ngp.observe.nvml import GpuSampler  # noqa: E402


def check_reduction() -> None:
    rt = dist.runtime()
    r, n = rt.rank, rt.size
    # rank r: util 90 - 10 r (the last rank is the minimum), samples 1000 (r + 1), its own GPU r
    row = {f: 0.0 for f in RANK_FIELDS}
    row.update(
        steps=5,
        samples=1000 * (r + 1),
        seconds=1.0 + r,
        comm_seconds=0.1,
        loss_sum=0.1 * (r + 1),
        gpu_util=90 - 10 * r,
        gpu_power=100 + r,
        gpu_energy=200 + r,
        gpu_id=r,
        gpu_mem_used=math.nan if r == 0 else float(r << 30),
        gpu_mem_total=float(8 << 30),
    )
    calls = COMM_CLOCK.calls
    t = gather_rows(torch.tensor([row[f] for f in RANK_FIELDS], dtype=torch.float64))
    assert COMM_CLOCK.calls - calls == 1, f"{COMM_CLOCK.calls - calls} collectives, expected exactly one"
    digests = dist.allgather_object(t.numpy().tobytes(), name="check.table")
    assert all(d == digests[0] for d in digests), "ranks hold different tables"
    rec = interval_record(t.numpy(), step=5, train_s=float(n), occupancy=None)
    utils = [90 - 10 * q for q in range(n)]
    assert rec["gpu_util"] == sum(utils) / n, rec
    assert (rec["gpu_util_min"], rec["gpu_util_min_rank"]) == (utils[-1], n - 1), rec
    assert (rec["gpu_util_max"], rec["gpu_util_max_rank"]) == (90, 0), rec
    assert rec["samples"] == 1000 * n * (n + 1) / 2 and rec["interval_s"] == n, rec
    # compute throughput: samples / (seconds - comm seconds) = 1000 (r + 1) / (r + 0.9), lowest on the last rank
    assert math.isclose(rec["rank_samples_per_s_min"], 1000 * n / (n - 0.1)), rec
    assert rec["rank_samples_per_s_min_rank"] == n - 1, rec
    assert math.isclose(rec["loss"], sum(0.1 * (q + 1) for q in range(n)) / n / 5), rec
    assert rec["power_w"] == sum(100 + q for q in range(n)) and rec["gpus_measured"] == n, rec
    # rank 0 measured no memory: the maximum is over the others
    assert rec["gpu_mem_used_gib_max"] == n - 1 and rec["gpu_mem_used_gib_max_rank"] == n - 1, rec
    if rt.is_root:
        print(
            f"CHECK reduction OK (one collective, min GPU util {rec['gpu_util_min']:.0f}% on rank "
            f"{rec['gpu_util_min_rank']})",
            flush=True,
        )


def check_monitor(out_dir: Path) -> None:
    rt = dist.runtime()
    fake = FakeNvml(util=90 - 10 * rt.rank, power_w=300)
    shared_gpu = GpuSampler(torch.device("cuda", 0), period_s=0.05, nvml=fake)  # every rank on "GPU 0"
    settings = MonitorSettings(
        jsonl=out_dir / "m.jsonl",
        tensorboard=None,
        progress=False,
        comm_timing=True,
        gpu_sample_period_s=0.05,
        append=False,
    )
    monitor = Monitor(settings, total_steps=6, gpu=shared_gpu)
    stats = monitor.new_interval()
    for _ in range(6):
        stats.add(torch.tensor(0.02), torch.tensor(0.01), 100, 1000)
        dist.allreduce(torch.ones(4), "sum", name="check.step")
    rec = monitor.end_interval(6, stats, train_s=1.0, occupancy=0.5)
    monitor.close()
    assert rec["gpu_util_min_rank"] == rt.size - 1 and rec["gpu_util_max_rank"] == 0, rec
    assert rec["gpus_measured"] == 1 and rec["power_w"] == 300, f"one physical GPU counted {rec['gpus_measured']} times"
    if rt.is_root:
        line = format_line(rec)
        assert f"(min {90 - 10 * (rt.size - 1)}% rank {rt.size - 1})" in line, line
        (saved,) = [json.loads(x) for x in (out_dir / "m.jsonl").read_text().splitlines()]
        assert list(saved) == list(JSONL_FIELDS) and saved["samples"] == 6000 * rt.size, saved
        print(f"CHECK monitor OK: {line}", flush=True)


def check_comm_share() -> None:
    rt = dist.runtime()
    settings = MonitorSettings(
        jsonl=None, tensorboard=None, progress=False, comm_timing=True, gpu_sample_period_s=1.0, append=False
    )
    monitor = Monitor(settings, total_steps=4)
    stats = monitor.new_interval()
    for _ in range(4):
        if rt.rank == rt.size - 1:
            time.sleep(0.25)  # the straggler: everyone else waits for it inside the collective
        dist.allreduce(torch.ones(16), "sum", name="check.comm")
        stats.add(torch.tensor(0.0), torch.tensor(0.0), 1, 1)
    rec = monitor.end_interval(4, stats, train_s=1.0)
    monitor.close()
    assert rec["comm_fraction_min_rank"] == rt.size - 1, rec
    assert rec["rank_samples_per_s_min_rank"] == rt.size - 1, rec  # the sleeper computes slowest
    assert rec["comm_fraction_max"] > 0.5 > rec["comm_fraction_min"], rec
    if rt.is_root:
        print(
            f"CHECK comm_share OK (waiting ranks {100 * rec['comm_fraction_max']:.0f}%, "
            f"straggler {100 * rec['comm_fraction_min']:.0f}%)",
            flush=True,
        )


def main() -> None:
    out_dir = Path(sys.argv[1])
    rt = dist.init("cpu")
    assert rt.size >= 2, "run me under horovodrun -np 2 (or more)"
    if rt.is_root:
        out_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    check_reduction()
    check_monitor(out_dir)
    check_comm_share()


if __name__ == "__main__":
    main()
