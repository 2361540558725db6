"""Real ranks: fp16 gradient compression and gradient accumulation under horovodrun -np 2 (Gloo and MPI)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import TINY_ARGS, run_ranks

from hvd_ngp.config import BASE_CONFIG

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_compression_and_accumulation_match_the_reference(controller, scene_cache):
    proc = run_ranks(["tests/parallel/check_comm.py", str(scene_cache)], controller=controller)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for check in ("fp16_compression", "accumulation"):
        assert f"CHECK {check} OK" in out, out[-4000:]


def test_distributed_block_mismatch_fails_on_every_rank(tmp_path):
    config = tmp_path / "four.json"
    config.write_text(json.dumps({"parent": str(BASE_CONFIG), "distributed": {"world_size": 4}}))
    start = time.monotonic()
    proc = run_ranks(
        [
            "-m",
            "hvd_ngp.train",
            "--config",
            str(config),
            *TINY_ARGS,
            "--out_dir",
            str(tmp_path / "o"),
            "--device",
            "cpu",
        ],
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and time.monotonic() - start < 60
    errors = out.split("hvd_ngp: error:")[1:]
    assert len(errors) == 2 and "Traceback" not in out, out[-3000:]
    assert all(f"{config}: distributed.world_size is 4 but the job runs 2 rank(s)" in e for e in errors), errors
