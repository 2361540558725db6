"""The GPU benchmark suite (benchmarks/run.sh, benchmarks/tables.py) checked on the CPU: its steps are named for
what they measure and documented, bad calls fail with one line, its tables read what the runs write, the
Chromium bundle for the GPU machine arrives in parts, and the benches never append to docs/BENCHMARKS.md unless
asked."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess

import pytest
from conftest import ROOT

RUN = ROOT / "benchmarks" / "run.sh"


def run_suite(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(RUN), *args], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


def tables_module():
    spec = importlib.util.spec_from_file_location("benchmark_tables", ROOT / "benchmarks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_are_named_for_what_they_measure_and_documented():
    proc = run_suite("list")
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert {
        "stage",
        "gpu-tests",
        "throughput",
        "quality-vs-time",
        "against-instant-ngp",
        "memory",
        "scaling",
        "batch",
        "inference",
        "export",
        "viewer",
        "colmap",
    } <= set(steps)
    assert not [s for s in steps if re.search(r"\d", s)], "a step named after an issue number"
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert not [s for s in steps if f"`{s}`" not in readme], "steps missing from benchmarks/README.md"


def test_bad_calls_fail_with_one_line(tmp_path):
    unknown = run_suite("throughput16", str(tmp_path))
    assert unknown.returncode == 2 and unknown.stderr.strip().count("\n") == 0
    assert "unknown step 'throughput16'" in unknown.stderr
    no_out = run_suite("throughput")
    assert no_out.returncode == 2 and "give the OUT folder" in no_out.stderr
    unstaged = run_suite("quality-vs-time", str(tmp_path / "out"), HVD_NGP_STAGE=str(tmp_path / "empty"))
    assert unstaged.returncode == 3 and unstaged.stderr.strip().count("\n") == 0
    assert f"lego is not staged in {tmp_path / 'empty'} (train 0 of 100" in unstaged.stderr


def _metrics(folder, steps, curve):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(
        json.dumps(
            {
                "steps": steps,
                "train_seconds": curve[-1][0],
                "test_psnr": curve[-1][1],
                "test_views": 200,
                "curve": [{"seconds": s, "psnr": p} for s, p in curve],
                "memory": {"budget_gib": 8.0, "peak": {"train": 3.5}},
            }
        )
    )


def test_tables_read_runs_throughput_pytest_and_the_anchor(tmp_path, capsys):
    t = tables_module()
    _metrics(tmp_path / "quality_lego_60s_1337", 9000, [(15.0, 31.5), (30.0, 33.0), (60.2, 34.1)])
    _metrics(tmp_path / "quality_lego_60s_1", 9100, [(15.1, 31.4), (60.0, 34.3)])
    assert t.main(["runs", str(tmp_path), "quality_lego", "quality_lego_*"]) == 0
    rows = json.loads((tmp_path / "quality_lego.json").read_text())["rows"]
    assert [r["run"] for r in rows] == ["quality_lego_60s_1", "quality_lego_60s_1337"]
    assert rows[1]["curve"] == "15s:31.50 30s:33.00 60.2s:34.10" and rows[1]["memory budget GiB"] == 8.0
    assert "| quality_lego_60s_1337 | 9000" in capsys.readouterr().out

    # instant-ngp's budgets with ours beside them where an evaluation is within 10% of the same seconds
    (tmp_path / "ingp.json").write_text(
        json.dumps({"budgets": [15, 30, 60], "steps": [4545, 13254, 30445], "psnr_white_1spp": [33.63, 34.35, 34.73]})
    )
    assert (
        t.main(["ingp", str(tmp_path), "ingp_lego", str(tmp_path / "ingp.json"), str(tmp_path / "quality_lego.json")])
        == 0
    )
    ingp = json.loads((tmp_path / "ingp_lego.json").read_text())["rows"]
    assert ingp[1] == {
        "seconds": 30,
        "instant-ngp steps": 13254,
        "instant-ngp dB": 34.35,
        "ours dB": "33.000 (quality_lego_60s_1337)",
    }
    assert ingp[2]["ours dB"] == "34.300 (quality_lego_60s_1) 34.100 (quality_lego_60s_1337)"

    # render time per test view: instant-ngp's, then ours by each inference path, as multiples of its time
    (tmp_path / "ingp_render.json").write_text(
        json.dumps(
            {"views": 20, "psnr_white_1spp": 34.5, "seconds_per_view": 0.02, "seconds_per_view_after_first": 0.005}
        )
    )
    # the third renders as instant-ngp does (its marching recorded in render.json): the row says so
    ngp_marching = {"eval_steps_per_diagonal": 1024, "early_termination": 0.01, "cone_angle": 0}
    runs = (("two_pass", 35.1, 0.4, {}), ("single_pass", 35.1, 0.03, {}), ("single_pass_ngp", 34.9, 0.02, ngp_marching))
    for name, psnr, seconds, marching in runs:
        (tmp_path / f"render_{name}.json").write_text(
            json.dumps(
                {
                    "inference": name.removesuffix("_ngp"),
                    "test_views": 20,
                    "test_psnr": psnr,
                    "test_seconds_per_view": seconds,
                    "test_seconds_per_view_after_first": seconds / 2,
                    **({"marching": marching} if marching else {}),
                }
            )
        )
    ours = [str(tmp_path / f"render_{r[0]}.json") for r in runs]
    assert t.main(["renders", str(tmp_path), "render_lego", str(tmp_path / "ingp_render.json"), *ours]) == 0
    table = json.loads((tmp_path / "render_lego.json").read_text())
    assert [r["x instant-ngp"] for r in table["rows"]] == [1.0, 20.0, 1.5, 1.0]
    assert [r["x after the first"] for r in table["rows"]] == [1.0, 40.0, 3.0, 2.0]
    assert table["rows"][3]["renderer"] == "hvd_ngp single_pass (1024 steps, stop at 0.01)"
    assert table["summary"]["hvd_ngp single_pass"] == {
        "x_instant_ngp": 1.5,
        "x_instant_ngp_after_first": 3.0,
        "psnr_minus_instant_ngp": 0.6,
    }

    for name, rate in (("throughput_new_1", 100e6), ("throughput_new_2", 110e6), ("throughput_new_3", 90e6)):
        (tmp_path / f"{name}.json").write_text(
            json.dumps(
                {
                    "training": [
                        {
                            "backend": "triton",
                            "precision": "bf16",
                            "samples_per_sec": rate,
                            "step_ms": 2.5,
                            "rays_per_step": 1e5,
                        }
                    ]
                }
            )
        )
    files = [str(p) for p in sorted(tmp_path.glob("throughput_new_*.json"))]
    assert t.main(["throughput", str(tmp_path), "throughput", *files]) == 0
    summary = json.loads((tmp_path / "throughput.json").read_text())["summary"]
    assert summary == {"throughput_new triton": {"median_M_samples_per_s": 100.0, "rounds": 3}}

    (tmp_path / "pytest_test_kernels.log").write_text(
        "..F.\nFAILED tests/test_kernels.py::test_march - x\n1 failed, 3 passed, 2 skipped in 9.1s\n"
    )
    (tmp_path / "pytest_test_render.log").write_text("....\n4 passed in 2.0s\n")
    (tmp_path / "pytest_test_hung.log").write_text("..\n")  # killed by its timeout: no closing line
    logs = [str(tmp_path / f"pytest_{n}.log") for n in ("test_kernels", "test_render")]
    assert t.main(["pytest", str(tmp_path), "gpu_tests", *logs]) == 1
    rows = json.loads((tmp_path / "gpu_tests.json").read_text())["rows"]
    assert rows[0]["failed"] == 1 and rows[0]["passed"] == 3 and rows[0]["skipped"] == 2
    assert rows[0]["failures"] == "tests/test_kernels.py::test_march"
    assert t.main(["pytest", str(tmp_path), "gpu_tests", logs[1]]) == 0
    assert t.main(["pytest", str(tmp_path), "gpu_tests", logs[1], str(tmp_path / "pytest_test_hung.log")]) == 1

    (tmp_path / "batch_raw.json").write_text(
        json.dumps({"runs": [{"k": 2, "seed": 1, "steps_to_psnr": {"33": 4000}, "curve": [1, 2]}]})
    )
    assert t.main(["rows", str(tmp_path), "batch", str(tmp_path / "batch_raw.json"), "runs"]) == 0
    assert json.loads((tmp_path / "batch.json").read_text())["rows"] == [{"k": 2, "seed": 1, "steps_to_psnr.33": 4000}]
    assert t.main(["runs", str(tmp_path), "nothing", "no_such_run*"]) == 1  # no rows is a failure


def test_benches_never_append_to_the_docs_by_default():
    """Every bench's --markdown defaults to nothing: results go where --json/--out_dir say."""
    seen = 0
    for path in sorted((ROOT / "hvd_ngp" / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") == "add_argument"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "--markdown"
            ):
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                assert isinstance(default, ast.Constant) and default.value in ("", None), (path.name, default)
                seen += 1
        assert 'docs/BENCHMARKS.md"' not in path.read_text(), path.name
    assert seen >= 7


def test_the_chromium_bundle_arrives_in_parts_over_several_calls(tmp_path):
    """benchmarks/chromium: pack.py splits an archive into parts and writes assemble.sh; on the GPU machine each
    call brings some parts (here: part 2, then a corrupt part 1, then parts 1 and 3); the bundle is unpacked
    once all have arrived with the right checksums, and later calls just name the launcher."""
    import io
    import tarfile

    spec = importlib.util.spec_from_file_location("pack", ROOT / "benchmarks" / "chromium" / "pack.py")
    pack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack)
    archive = tmp_path / "chrome.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        launcher = b"#!/bin/sh\necho headless\n" + bytes(range(256)) * 8  # not compressible to nothing
        info = tarfile.TarInfo("chrome/run-chromium")
        info.size, info.mode = len(launcher), 0o755
        tar.addfile(info, io.BytesIO(launcher))
    size = archive.stat().st_size
    with pytest.raises(ValueError, match="more than the parts hold"):
        pack.pack(archive, tmp_path / "small", (10, 10))
    third = size // 3 + 1
    parts = pack.pack(archive, tmp_path / "packed", (third, third, third))
    assert len(parts) == 3 and b"".join(p.read_bytes() for p in parts) == archive.read_bytes()

    repo = tmp_path / "repo"
    env = {
        "PATH": os.environ["PATH"],
        "HVD_NGP_CHROME_PARTS": str(tmp_path / "parts"),
        "HVD_NGP_CHROME_BUNDLE": str(tmp_path / "bundle"),
    }

    def call(*names: str, corrupt: bool = False) -> subprocess.CompletedProcess:
        """One device call that carries assemble.sh and the named parts."""
        shutil.rmtree(repo, ignore_errors=True)
        (repo / ".chrome").mkdir(parents=True)
        shutil.copy(tmp_path / "packed" / "assemble.sh", repo / ".chrome")
        for name in names:
            data = (tmp_path / "packed" / name).read_bytes()
            (repo / ".chrome" / name).write_bytes(data[:-1] + b"x" if corrupt else data)
        return subprocess.run(["bash", ".chrome/assemble.sh"], cwd=repo, env=env, capture_output=True, text=True)

    first = call("part-2")
    assert first.returncode == 0 and first.stdout.strip().splitlines()[-1] == "chromium: waiting for part(s) 1 3"
    bad = call("part-1", corrupt=True)
    assert bad.returncode == 2 and "checksum mismatch for part 1" in bad.stdout
    done = call("part-1", "part-3")
    launcher_path = tmp_path / "bundle" / "chrome" / "run-chromium"
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"chromium: {launcher_path}"
    assert subprocess.run([str(launcher_path)], capture_output=True, text=True).stdout.startswith("headless")
    again = call()
    assert again.returncode == 0 and again.stdout.strip() == f"chromium: {launcher_path}"
