"""The package as users install it: a wheel that carries its configs and the C++ kernel's source, console
scripts for every tool, built-in configs found by name from any directory."""

from __future__ import annotations

import ast
import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, TINY_ARGS, _tiny_block

from hvd_ngp.config import BASE_CONFIG, CONFIG_DIR, CPU_CONFIG, config_file, load_json_config, parse_args

#: what a wheel must carry besides Python modules (read at run time through Path(__file__))
PACKAGE_DATA = [
    "hvd_ngp/configs/nerf/base.json",
    "hvd_ngp/configs/nerf/cpu.json",
    "hvd_ngp/configs/nerf/big.json",
    "hvd_ngp/configs/nerf/captured.json",
    "hvd_ngp/configs/nerf/hashgrid.json",
    "hvd_ngp/model/encoding/csrc/hashgrid_cpu.cpp",
]
#: the files a wheel is built from (a copy: no stale build/ or egg-info of the checkout leaks into it)
BUILD_INPUTS = ["setup.cfg", "pyproject.toml", "README.md", "hvd_ngp"]


def console_scripts() -> dict[str, str]:
    """setup.cfg's console scripts: name -> 'module:function'."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict((part.strip() for part in line.split("=", 1)) for line in lines)


def _module_file(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def defining_module(module: str, name: str) -> str:
    """The module whose source defines top-level function ``name``, following ``from X import name`` (static)."""
    tree = ast.parse(_module_file(module).read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return module
        if isinstance(node, ast.ImportFrom) and any(a.name == name and a.asname is None for a in node.names):
            package = module.split(".")[: len(module.split(".")) - node.level] if node.level else []
            if node.level and _module_file(module).name == "__init__.py":
                package = module.split(".")[: len(module.split(".")) - node.level + 1]
            return defining_module(".".join([*package, *([node.module] if node.module else [])]), name)
    raise LookupError(f"{module} has no top-level {name}")


def tool_modules() -> list[str]:
    """Modules that run as ``python -m hvd_ngp.X``: public ones with a ``__main__`` guard, and ``__main__.py``s."""
    found = []
    for path in sorted((ROOT / "hvd_ngp").rglob("*.py")):
        if path.name.startswith("_") and path.name != "__main__.py":
            continue  # private helpers (a rank's script) and package __init__s
        text = path.read_text()
        if path.name == "__main__.py" or 'if __name__ == "__main__"' in text:
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def test_every_tool_has_a_console_script():
    """Each ``python -m hvd_ngp.X`` tool's ``cli`` is the target of a console script, and every console script
    names a function that exists."""
    targets = {}
    for script, target in console_scripts().items():
        module, func = target.split(":")
        targets[(defining_module(module, func), func)] = script
    tools = tool_modules()
    assert {"hvd_ngp.train", "hvd_ngp.bench.__main__", "hvd_ngp.simhosts", "hvd_ngp.data.__main__"} <= set(tools)
    missing = [m for m in tools if (defining_module(m, "cli"), "cli") not in targets]
    assert not missing, f"tools without a console script in setup.cfg: {missing}"


def test_built_in_configs_are_package_data_found_by_name(tmp_path, monkeypatch):
    """The configs live inside the package; ``--config cpu.json``, ``cpu`` or the checkout's old
    ``configs/nerf/cpu.json`` name the built-in file from any directory; a user file of that name wins; a
    parent chain may end in a built-in config."""
    assert CONFIG_DIR == Path(__import__("hvd_ngp").__file__).parent / "configs" / "nerf"
    assert CPU_CONFIG.is_file() and BASE_CONFIG.is_file()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HVD_NGP_CONFIG", raising=False)
    for spelling in ("cpu.json", "cpu", "configs/nerf/cpu.json"):
        assert config_file(spelling) == CPU_CONFIG
        assert parse_args(["--config", spelling]).config == str(CPU_CONFIG.resolve())
    assert parse_args(["--config=configs/nerf/captured.json"]).config == str((CONFIG_DIR / "captured.json").resolve())
    assert config_file("elsewhere/cpu.json") == Path("elsewhere/cpu.json")  # only bare names and the old path
    mine = tmp_path / "cpu.json"
    mine.write_text(json.dumps({"parent": "base.json", "n_steps": 7}))  # no base.json beside it: the built-in one
    assert config_file("cpu.json") == Path("cpu.json")
    args = parse_args(["--config", "cpu.json"])
    assert args.config == str(mine) and args.n_steps == 7
    assert load_json_config(mine)["encoding"] == load_json_config(BASE_CONFIG)["encoding"]
    monkeypatch.setenv("HVD_NGP_CONFIG", "captured")
    assert parse_args([]).config == str((CONFIG_DIR / "captured.json").resolve())


def _venv_with_parent_packages(where: Path) -> Path:
    """A fresh venv whose only extra paths are this environment's site folders (no network needed: pip, torch,
    Horovod... come from there; path lines in a .pth, so an editable install's finder there is not run)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # this environment's site folders, the ones a parent environment lends it through a .pth included
    parents = dict.fromkeys(
        [
            sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["platlib"],
            *(p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")),
        ]
    )
    Path(site, "_hvd_ngp_parent_site.pth").write_text("".join(f"{p}\n" for p in parents))
    return python


@pytest.mark.packaging
def test_wheel_installs_into_a_fresh_venv_and_trains_from_outside_the_checkout(tmp_path, scene_cache):
    """``pip wheel . --no-deps`` carries the configs and the C++ source; installed into a fresh venv it gives
    every console script, and ``hvd-ngp-train`` runs 20 steps on the built-in scene from a directory outside
    the checkout with PYTHONPATH unset, with the installed package and its built-in CPU config."""
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        kwargs = {"ignore": shutil.ignore_patterns("__pycache__", "*.pyc")} if (ROOT / name).is_dir() else {}
        copy(ROOT / name, src / name, **kwargs)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HVD_NGP_CONFIG", "VIRTUAL_ENV")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--disable-pip-version-check",
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("hvd_ngp-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [f for f in PACKAGE_DATA if f not in names], sorted(n for n in names if not n.endswith(".py"))

    python = _venv_with_parent_packages(tmp_path / "venv")
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    bin_dir = python.parent
    assert not [s for s in console_scripts() if not (bin_dir / s).is_file()]

    work = tmp_path / "elsewhere"  # not the checkout: nothing there to find configs or sources in by accident
    work.mkdir()
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import hvd_ngp.config as c, hvd_ngp.model.encoding.hashgrid_cpp as h;"
            "print(c.CPU_CONFIG); print(h.SOURCE.resolve())",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
    ).stdout.split()
    venv = (tmp_path / "venv").resolve()
    assert all(Path(p).is_relative_to(venv) and Path(p).is_file() for p in probe), probe
    assert Path(probe[1]).read_bytes() == (ROOT / "hvd_ngp/model/encoding/csrc/hashgrid_cpu.cpp").read_bytes()

    out = work / "run"
    # --backend torch: the C++ kernel would compile here for a minute (its source's presence is checked above; the
    # same source compiles in tests/test_encoding.py)
    coarse_eval = _tiny_block("--marching", eval_steps_per_diagonal=64)  # the evaluation as coarse as training
    proc = subprocess.run(
        [
            str(bin_dir / "hvd-ngp-train"),
            *TINY_ARGS,
            "--marching",
            coarse_eval,
            "--n_eval_views",
            "1",
            "--n_steps",
            "20",
            "--log_every",
            "10",
            "--device",
            "cpu",
            "--backend",
            "torch",
            "--progress",
            "off",
            "--scene_cache",
            str(scene_cache),
            "--out_dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 20 and metrics["test_views"] == 1 and metrics["test_psnr"] > 5
    assert Path(metrics["config"]) == venv / Path(probe[0]).relative_to(venv)  # the wheel's cpu.json, by default
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert history, "no metrics lines written"
    assert (out / "renders" / "test_000.png").stat().st_size > 0
