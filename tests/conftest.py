"""Shared test helpers: launching real ranks, tiny configs, GPU skips that can be made strict."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run under Triton's CPU interpreter; it must be chosen before any
# kernel module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Under the interpreter a kernel's stray access corrupts this process (a segmentation fault much later):
# check every access against the launch's tensors instead (tests/interpreter_checks.py), unless
# HVD_NGP_INTERPRETER_CHECKS=0.
if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("HVD_NGP_INTERPRETER_CHECKS", "1") != "0":
    import interpreter_checks

    interpreter_checks.install()

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("HVD_NGP_SHARED_DATA", ROOT.parent / "shared" / "data"))

#: a model small enough that a CPU step takes milliseconds
TINY_ENCODING = '{"n_levels": 4, "log2_hashmap_size": 12, "base_resolution": 8, "desired_resolution": 64}'
TINY_ARGS = [
    "--encoding",
    TINY_ENCODING,
    "--density_network",
    '{"n_neurons": 16}',
    "--rgb_network",
    '{"n_neurons": 16}',
    "--marching",
    '{"grid_resolution": 16, "steps_per_diagonal": 64, "warmup_steps": 4}',
    "--target_samples",
    "1024",
    "--n_rays_init",
    "128",
    "--save_renders",
    "1",
    "--n_eval_views",
    "2",
]


def _tiny_block(flag: str, **changes) -> str:
    """TINY_ARGS's JSON block of ``flag`` with ``changes`` (a second ``--flag`` replaces the first)."""
    import json

    return json.dumps({**json.loads(TINY_ARGS[TINY_ARGS.index(flag) + 1]), **changes})


#: the tiny model's blocks for training steps whose Triton kernels run under the CPU interpreter, which steps
#: through every program in Python (a 5-step test took minutes with the GPU's launches): few programs (big
#: launch blocks: every launch computes the same values, test_kernels checks that), the hash-grid backward
#: without run merging (a segmented scan the interpreter walks element by element; its own parity test covers
#: it) and at most 128 march steps (the tiny model's training rays take at most 66: test_graphed checks that)
INTERPRETER_ARGS = [
    "--encoding",
    _tiny_block(
        "--encoding",
        merge_runs_below=0,
        forward_launch={"block": 1024, "warps": 4},
        backward_launch={"block": 1024, "warps": 4},
    ),
    "--marching",
    _tiny_block("--marching", max_steps=128, kernel_launch={"block": 128, "segment": 32, "warps": 1}),
]


#: test modules whose tests mostly run Triton kernels under the CPU interpreter: the "interpreter" lane
#: (scripts/test.sh runs the lanes side by side)
INTERPRETER_MODULES = {"test_kernels", "test_mlp_kernels", "test_graphed", "test_ahead"}
#: modules whose tests share machine-wide state (simulated hosts' network namespaces and subnet): under
#: pytest-xdist's loadgroup, each module's tests run on one worker
ONE_WORKER_MODULES = {"test_simhosts", "test_links"}
#: what in a test's own source says that it launches real ranks
LAUNCHES_RANKS = ("run_ranks(", "horovodrun", "mpirun", "simhosts", "run_script(", "start_script(")


def pytest_collection_modifyitems(config, items) -> None:
    """Lanes: a test that launches ranks (the ``parallel`` marker, or its source calls a launcher) is marked
    ``parallel``; the other tests of INTERPRETER_MODULES are marked ``interpreter``."""
    import inspect

    for item in items:
        fn = getattr(item, "function", None)
        if item.get_closest_marker("parallel") is None and fn is not None:
            try:
                source = inspect.getsource(fn)
            except (OSError, TypeError):
                source = ""
            if any(token in source for token in LAUNCHES_RANKS):
                item.add_marker(pytest.mark.parallel)
        if item.get_closest_marker("parallel") is None and item.module.__name__ in INTERPRETER_MODULES:
            item.add_marker(pytest.mark.interpreter)
        if item.module.__name__ in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def tensor_digest(tensors) -> str:
    """SHA-256 of the tensors' raw bytes (any dtype, any device), in order: equal digests, bit-identical tensors."""
    import hashlib

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tiny_cpu_args(scene_cache: Path, out_dir: Path, *more: str) -> list[str]:
    """Trainer flags for the tiny model on the built-in scene on the CPU, writing to ``out_dir``."""
    from hvd_ngp.config import CPU_CONFIG

    return [
        "--config",
        str(CPU_CONFIG),
        *TINY_ARGS,
        "--scene_cache",
        str(scene_cache),
        "--device",
        "cpu",
        "--out_dir",
        str(out_dir),
        *more,
    ]


def tiny_trainer(scene_cache: Path, out_dir: Path, steps: int):
    """A ``Trainer`` of the tiny model after ``steps`` training steps (in this process, size 1)."""
    from hvd_ngp.config import parse_args
    from hvd_ngp.training.trainer import Trainer

    tr = Trainer.build(parse_args(tiny_cpu_args(scene_cache, out_dir, "--n_steps", str(steps))))
    for step in range(steps):
        tr.step(step)
        tr.state.step = step + 1
    return tr


def gpu_or_skip() -> None:
    """Skip without a GPU, unless HVD_NGP_REQUIRE_GPU=1 (GPU machines), where that is a failure."""
    if not torch.cuda.is_available():
        if os.environ.get("HVD_NGP_REQUIRE_GPU") == "1":
            pytest.fail("HVD_NGP_REQUIRE_GPU=1 but torch sees no CUDA GPU")
        pytest.skip("needs a CUDA GPU")


def horovodrun() -> str:
    exe = Path(sys.executable).with_name("horovodrun")
    if exe.exists():
        return str(exe)
    found = shutil.which("horovodrun")
    if not found:
        pytest.skip("horovodrun not installed (run scripts/setup.sh)")
    return found


def run_ranks(
    module_args: list[str], np: int = 2, controller: str = "mpi", env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``horovodrun -np N -H localhost:N [--gloo|--mpi] python <module_args>`` -> completed process."""
    cmd = [horovodrun(), "-np", str(np), "-H", f"localhost:{np}", f"--{controller}", sys.executable, *module_args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def scene_cache(tmp_path_factory) -> Path:
    """One built-in scene generation for the whole session."""
    from hvd_ngp.data.builtin import ensure_builtin

    cache = tmp_path_factory.mktemp("scenes")
    ensure_builtin(cache, 0)
    return cache
