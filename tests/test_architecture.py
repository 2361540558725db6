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


#: the modules that may read a parsed Namespace (issue 47: parse once into frozen dataclasses, then no module
#: past the parser reads a Namespace): the trainer's parser, the settings groups it fills, and the helper that
#: turns a tool's Namespace into its options dataclass
NAMESPACE_READERS = ("hvd_ngp/config.py", "hvd_ngp/settings.py", "hvd_ngp/options.py")
PARSE_CALLS = {"parse_args", "parse_known_args", "parse_intermixed_args", "parse_known_intermixed_args"}


def namespace_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every read of a parsed Namespace in ``source``: an attribute of ``args``, or of a
    name that the same function binds to a ``parse_args``-like call's result or declares ``argparse.Namespace``,
    or of ``<obj>.args``; ``getattr``/``setattr``/``hasattr``/``vars`` of such a name count too, and so do
    assignments to its attributes (a Namespace changed after parsing)."""
    found: list[tuple[int, str]] = []

    def is_namespace_annotation(node: ast.expr | None) -> bool:
        text = ast.unparse(node) if node is not None else ""
        return text in ("argparse.Namespace", "Namespace", "configargparse.Namespace")

    def scope_nodes(scope: ast.AST):
        """The nodes of ``scope`` outside the functions and classes nested in it."""
        todo = list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            yield node
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.extend(ast.iter_child_nodes(node))

    def visit(scope: ast.AST) -> None:
        names = {"args"}
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            every = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs
            names |= {a.arg for a in every if is_namespace_annotation(a.annotation)}
        nodes = list(scope_nodes(scope))
        for node in nodes:
            value, targets = None, []
            if isinstance(node, ast.Assign):
                value, targets = node.value, node.targets
            elif isinstance(node, ast.AnnAssign):
                value, targets = node.value, [node.target]
                if isinstance(node.target, ast.Name) and is_namespace_annotation(node.annotation):
                    names.add(node.target.id)
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in PARSE_CALLS:
                for t in targets:
                    first = t.elts[0] if isinstance(t, ast.Tuple) and t.elts else t
                    if isinstance(first, ast.Name):
                        names.add(first.id)
        for node in nodes:
            if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Name) and node.value.id in names)
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "args")  # self.args.<name>
            ):
                found.append((node.lineno, ast.unparse(node)))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "vars", "hasattr")
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in names
            ):
                found.append((node.lineno, ast.unparse(node)))
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(node)

    visit(ast.parse(source))
    return sorted(set(found))


def test_namespace_reads_are_found():
    """Each way of reading a Namespace is caught; dataclass options built from one are not."""
    source = (
        "import argparse\n"
        "def main(argv):\n"
        "    args = parser.parse_args(argv)\n"
        "    return args.scene\n"
        "def tool(argv):\n"
        "    ns, rest = parser.parse_known_args(argv)\n"
        "    return getattr(ns, 'port'), vars(ns)\n"
        "def check(flags: argparse.Namespace):\n"
        "    flags.n_steps = 3\n"
        "def clean(argv):\n"
        "    opts = options_from(Options, parser.parse_args(argv))\n"
        "    ns = Options(port=1)\n"
        "    return opts.scene, ns.port\n"
        "class Trained:\n"
        "    def load(self):\n"
        "        return self.args.model\n"
    )
    assert namespace_reads(source) == [
        (4, "args.scene"),
        (7, "getattr(ns, 'port')"),
        (7, "vars(ns)"),
        (9, "flags.n_steps"),
        (16, "self.args.model"),
    ]


def test_no_namespace_is_read_past_the_parsers():
    """Issue 47: zero ``args.<name>`` reads (and no read of any parsed Namespace) outside NAMESPACE_READERS."""
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 100, "hvd_ngp not found: the check is broken"
    allowed = {ROOT / name for name in NAMESPACE_READERS}
    assert all(p.is_file() for p in allowed), "a NAMESPACE_READERS module moved: update the list"
    reads = [
        f"{p.relative_to(ROOT)}:{line}: {text}"
        for p in paths
        if p not in allowed
        for line, text in namespace_reads(p.read_text())
    ]
    assert not reads, f"{len(reads)} Namespace read(s) past the parsers (parse into a frozen dataclass):\n" + "\n".join(
        reads
    )
