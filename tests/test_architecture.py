"""The architecture, held by tools: the import-linter contracts in setup.cfg (layers, the one Horovod
importer, a model that knows no rays or ranks, a renderer without ranks or scenes, an observer that plans no
render, testing reached only through the fault registry) and no import cycle between hvd_ngp's modules."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hvd_ngp"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with setup.cfg's contracts on the ``hvd_ngp`` package under ``root``."""
    lint = Path(sys.executable).parent / "lint-imports"
    assert lint.exists(), f"{lint}: install import-linter (scripts/requirements.txt)"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(lint), "--config", str(ROOT / "setup.cfg"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_contracts_hold():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" not in proc.stdout.split("Contracts:")[-1].replace("0 broken", "")


@pytest.mark.parametrize(
    "module, added, contract",
    [
        ("render/occupancy.py", "from ..cluster import dist", "The renderer is functions of tensors and callbacks"),
        (
            "render/volume.py",
            "from ..data.cameras import pixel_rays",
            "The renderer is functions of tensors and callbacks",
        ),
        ("observe/memory.py", "from ..render.plan import plan_render", "Observation measures and reports"),
        ("model/field.py", "from ..render.geometry import intersect_aabb", "The model knows no rays"),
    ],
)
def test_contracts_break_on_a_forbidden_import(tmp_path, module, added, contract):
    """A copy of the package with one forbidden import added: lint-imports fails, naming the contract and the
    import (the contracts are not vacuous, and the copy, not the checkout, was linted)."""
    shutil.copytree(PACKAGE, tmp_path / "hvd_ngp", ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    path = tmp_path / "hvd_ngp" / module
    path.write_text(path.read_text() + f"\n{added}  # noqa: E402\n")
    proc = lint_imports(tmp_path)
    out = " ".join((proc.stdout + proc.stderr).split())  # the report wraps long lines
    assert proc.returncode != 0, out
    source = "hvd_ngp." + module.removesuffix(".py").replace("/", ".")
    assert f"{contract}" in out.split("Contracts:")[-1] and "BROKEN" in out, out
    assert source in out, out


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """hvd_ngp modules that ``path`` imports, at module level or inside functions (lazy imports count:
    they run on call), leaving out ``if TYPE_CHECKING:`` blocks (never run)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                if f"{target}.{a.name}" in modules:
                    out.add(f"{target}.{a.name}")
                elif target in modules:
                    out.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    out.discard(name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := dfs(node)):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports_of(p, modules) for p in paths}
    assert graph["hvd_ngp.train"], "the import scan found nothing: the checker is broken"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


#: the longest function training/ may hold (issue 47: the trainer in three parts, each function readable)
MAX_FUNCTION_LINES = 80


def long_functions(path: Path, limit: int) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function in ``path`` (methods and nested functions included) whose
    definition, decorators left out, spans more than ``limit`` lines."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                lines = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and lines > limit:
                    found.append((name, lines))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return found


def test_long_functions_are_found(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(81))
    src = tmp_path / "m.py"
    src.write_text(
        f"class A:\n    def long(self):\n{body}\n\n    def short(self):\n        def inner():\n"
        f"            pass\n\n\ndef f():\n    return 1\n"
    )
    assert long_functions(src, MAX_FUNCTION_LINES) == [("A.long", 82)]
    assert long_functions(src, 100) == []


def test_no_function_in_training_is_over_the_limit():
    paths = sorted((PACKAGE / "training").glob("*.py"))
    assert len(paths) > 5, "training/ not found: the check is broken"
    over = [f"{p.name}: {name} ({lines} lines)" for p in paths for name, lines in long_functions(p, MAX_FUNCTION_LINES)]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines in hvd_ngp/training: " + "; ".join(over)
