"""``python -m hvd_ngp.bench batch`` in a tiny form, and the rule it relies on: K backward passes on one rank
take the learning rate of K ranks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import TINY_ARGS, tiny_cpu_args

from hvd_ngp.bench import batch
from hvd_ngp.config import parse_args
from hvd_ngp.errors import ConfigError
from hvd_ngp.training.trainer import Trainer


def trainer_flags(scene_cache, tmp_path) -> list[str]:
    """The tiny CPU run's flags less those the bench sets itself (--n_eval_views, --out_dir), evaluated with the
    training step's marching step (the evaluations are most of this test's time)."""
    flags = tiny_cpu_args(scene_cache, tmp_path)[:-2]
    i = flags.index("--n_eval_views")
    flags = flags[:i] + flags[i + 2 :]
    i = flags.index("--marching")
    return flags[: i + 1] + [json.dumps({**json.loads(flags[i + 1]), "eval_steps_per_diagonal": 64})] + flags[i + 2 :]


def test_k_passes_on_one_rank_take_the_learning_rate_of_k_ranks(scene_cache, tmp_path):
    for rule in ("auto", "sqrt", "linear", "none"):
        one = parse_args(["--device", "cpu", "--lr_scaling", rule, "--backward_passes_per_step", "4"]).comm
        four = parse_args(["--device", "cpu", "--lr_scaling", rule]).comm
        assert one.lr_multiplier(1, 1, False) == four.lr_multiplier(4, 4, False), rule
    tr = Trainer.build(parse_args(tiny_cpu_args(scene_cache, tmp_path, "--backward_passes_per_step", "4")))
    base, per_pass = tr.lr_at(0), tr.budget.n_rays
    _, n_rays = tr.step(0)
    assert [g["lr"] for g in tr.optimizer.param_groups] == [pytest.approx(base * 2.0)] * 2  # sqrt(4), as 4 ranks
    assert n_rays == 4 * per_pass  # four passes of the per-pass budget, as four ranks draw


def test_batch_bench_writes_the_schema(scene_cache, tmp_path):
    out = tmp_path / "batch.json"
    batch.main(
        [
            "--ks",
            "1,2",
            "--seeds",
            "3",
            "--psnr_targets",
            "5",
            "--eval_every",
            "4",
            "--n_eval_views",
            "1",
            "--max_steps",
            "40",
            "--out_dir",
            str(tmp_path / "b"),
            "--json",
            str(out),
            "--",
            *trainer_flags(scene_cache, tmp_path),
            "--log_every",
            "2",
        ]
    )
    data = json.loads(out.read_text())
    assert set(data) == {"scene", "device", "step_ms_per_backward_pass", "runs"} and data["device"] == "cpu"
    assert [(r["k"], r["seed"]) for r in data["runs"]] == [(1, 3), (2, 3)]
    for r in data["runs"]:
        keys = {"k", "seed", "samples_per_step", "step_ms", "steps_to_psnr", "final_psnr", "sync", "lr_multiplier"}
        assert set(r) == keys
        assert r["step_ms"] > 0 and r["final_psnr"] > 5 and r["sync"] == "every"
    one, two = data["runs"]
    # evaluations every 4 / K steps; 5 dB is reached at the first: each run stops there, not at --max_steps
    assert one["steps_to_psnr"] == {"5": 4} and two["steps_to_psnr"] == {"5": 2}
    assert data["step_ms_per_backward_pass"] == one["step_ms"]
    assert 1.3 < two["samples_per_step"] / one["samples_per_step"] < 2.7  # two passes of the per-pass budget
    details = json.loads((tmp_path / "b" / "details.json").read_text())["runs"]
    assert [d["steps"] for d in details] == [4, 2]
    assert [d["lr_multiplier"] for d in details] == [1.0, pytest.approx(2**0.5)]


def test_batch_bench_keeps_the_runs_before_one_that_is_killed(scene_cache, tmp_path, monkeypatch):
    """A run killed by a wall-clock limit (on the GPU machine a 560 s timeout cut a fox K = 16 run and, with it,
    the finished K = 1 run's numbers) leaves the runs before it in the JSON."""
    real, calls = batch.run, []

    def killed_second(settings, **kw):
        calls.append(settings)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what the process would die of
        return real(settings, **kw)

    monkeypatch.setattr(batch, "run", killed_second)
    out = tmp_path / "batch.json"
    args = ["--ks", "1,2", "--seeds", "3", "--psnr_targets", "5", "--eval_every", "4", "--n_eval_views", "1"]
    with pytest.raises(KeyboardInterrupt):
        batch.main([*args, "--max_steps", "8", "--out_dir", str(tmp_path / "b"), "--json", str(out), "--",
                    *trainer_flags(scene_cache, tmp_path)])  # fmt: skip
    data = json.loads(out.read_text())
    assert [(r["k"], r["seed"]) for r in data["runs"]] == [(1, 3)] and data["step_ms_per_backward_pass"] > 0
    assert len(json.loads((tmp_path / "b" / "details.json").read_text())["runs"]) == 1


def test_steps_to_a_target_is_the_first_evaluation_at_or_above_it():
    curve = [
        {"step": 4, "psnr": 20.0},
        {"step": 8, "psnr": 33.0},
        {"step": 12, "psnr": 32.5},
        {"step": 16, "psnr": 35.2},
    ]
    assert [batch.steps_to(curve, t) for t in (33.0, 35.0, 36.0)] == [8, 16, None]


def test_batch_bench_refuses_flags_it_sets():
    with pytest.raises(ConfigError, match="--seed is set by the benchmark"):
        batch.main(["--max_steps", "4", "--", *TINY_ARGS, "--seed", "3"])
    with pytest.raises(ConfigError, match="give --budget_s or --max_steps"):
        batch.main(["--", *TINY_ARGS])


def test_a_run_stopped_by_a_signal_is_left_out_and_the_bench_exits_75(scene_cache, tmp_path, monkeypatch):
    """A signal cut the K = 2 run short (a scheduler's SIGTERM; on the GPU machine a time limit): the K = 1 run is
    written, the cut run and the ones after it are not, and the bench exits with the stop's status 75."""
    real_run = batch.run

    def stopped_at_k2(args, stop_after_eval=None):
        if args.runtime.comm.backward_passes_per_step == 2:
            return SimpleNamespace(stopped="SIGTERM on rank 0", step=3, metrics={})
        return real_run(args, stop_after_eval=stop_after_eval)

    monkeypatch.setattr(batch, "run", stopped_at_k2)
    out = tmp_path / "batch.json"
    with pytest.raises(SystemExit) as stop:
        batch.main(
            [
                "--ks",
                "1,2,4",
                "--seeds",
                "3",
                "--psnr_targets",
                "5",
                "--eval_every",
                "4",
                "--n_eval_views",
                "1",
                "--max_steps",
                "8",
                "--out_dir",
                str(tmp_path / "b"),
                "--json",
                str(out),
                "--",
                *trainer_flags(scene_cache, tmp_path),
                "--log_every",
                "2",
            ]
        )
    assert stop.value.code == 75
    assert [r["k"] for r in json.loads(out.read_text())["runs"]] == [1]


def test_parallel_runs_of_two_modes_merge_in_plan_order(scene_cache, tmp_path):
    """--parallel 2 --modes every,delayed_grid: two bench processes at once; one JSON with both rows in plan order,
    each naming its sync, marked shared_device (its step times are not one device's), each run in its folder."""
    out = tmp_path / "batch.json"
    args = ["--ks", "2", "--seeds", "3", "--modes", "every,delayed_grid", "--parallel", "2", "--psnr_targets", "5"]
    summary = batch.main([*args, "--eval_every", "4", "--n_eval_views", "1", "--max_steps", "6",
                          "--out_dir", str(tmp_path / "b"), "--json", str(out), "--",
                          *trainer_flags(scene_cache, tmp_path)])  # fmt: skip
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(summary)) and data["shared_device"] is True
    assert [(r["k"], r["sync"]) for r in data["runs"]] == [(2, "every"), (2, "delayed_grid")]
    assert all(r["steps_to_psnr"] == {"5": 2} for r in data["runs"])  # the first evaluation (every 4 / K steps)
    assert (tmp_path / "b" / "seed3_k2" / "metrics.json").exists()
    assert (tmp_path / "b" / "seed3_k2_delayed_grid" / "metrics.json").exists()
    assert len(json.loads((tmp_path / "b" / "details.json").read_text())["runs"]) == 2


def test_parallel_runs_that_fail_name_their_logs_and_exit_1(scene_cache, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        batch.main(["--ks", "1,2", "--seeds", "3", "--parallel", "2", "--max_steps", "4", "--out_dir",
                    str(tmp_path / "b"), "--", *trainer_flags(scene_cache, tmp_path), "--scene", str(tmp_path / "none")])  # fmt: skip
    assert stop.value.code == 1
    err = capsys.readouterr().err
    for name in ("seed3_k1", "seed3_k2"):
        log = tmp_path / "b" / "parallel" / f"{name}.log"
        assert f"{name}: exit " in err and str(log) in err
        assert str(tmp_path / "none") in log.read_text()  # the child's own one-line error names the scene


def test_modes_are_checked_and_own_the_sync_flags():
    with pytest.raises(ConfigError, match="--modes: unknown"):
        batch.main(["--max_steps", "4", "--modes", "every,sometimes", "--", *TINY_ARGS])
    with pytest.raises(ConfigError, match="--modes periodic,delayed_grid\\+comp: the ranks of these modes differ"):
        batch.main(["--max_steps", "4", "--modes", "periodic,delayed_grid+comp", "--", *TINY_ARGS])
    with pytest.raises(ConfigError, match="--grad_sync is set by the benchmark"):
        batch.main(["--max_steps", "4", "--modes", "every,delayed_grid", "--", "--grad_sync", "delayed"])
