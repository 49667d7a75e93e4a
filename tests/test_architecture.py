"""The package layout of docs/architecture.md, enforced by reading the source with `ast` (nothing is imported).

Rules: imports run down the layer order (model and data never import each other); no import cycle between
bertrain modules (imports under `if TYPE_CHECKING:` count: they are module-level imports to a reader); no
function-level import of a bertrain module outside bertrain/cli/; no module over MAX_LINES lines. Each failure lists every offender as `file:line: what`, and
`python3 tests/test_architecture.py` prints all findings at once.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bertrain"
MAX_LINES = 400

# Row of each top-level part of the package (docs/architecture.md); a module imports only from its own row
# or a lower one. `bertrain` itself is the package's __init__, `bertrain.__main__` the `python -m` entry.
LAYERS = {
    "bertrain.cli": 4, "bertrain.demo": 4, "bertrain.__main__": 4,
    "bertrain.train": 3,
    "bertrain.model": 2, "bertrain.data": 2,
    "bertrain.config": 1, "bertrain.rundir": 1, "bertrain.files": 1, "bertrain.special_tokens": 1,
    "bertrain.errors": 1, "bertrain.console": 1, "bertrain.exit_status": 1, "bertrain.tokenizer_file": 1,
    "bertrain.batch_layout": 1, "bertrain.batch_buffer": 1, "bertrain.child_process": 1, "bertrain.kernel_trial": 1,
    "bertrain": 1,
}
NEVER_IMPORT_EACH_OTHER = ("bertrain.model", "bertrain.data")
LAZY_IMPORTS_ALLOWED_UNDER = "bertrain.cli"


@dataclass(frozen=True)
class Import:
    """One import of a bertrain module found in the source."""

    source: str        # importing module, e.g. bertrain.train.loop
    target: str        # imported bertrain module, e.g. bertrain.config
    path: Path
    line: int
    in_function: bool  # inside a def: runs when called, not when the module is imported

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in path.parts}


def top_part(module: str) -> str:
    """The key of LAYERS a module belongs to: `bertrain.train.loop` -> `bertrain.train`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def layer(module: str) -> int | None:
    return LAYERS.get(top_part(module))


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name of `from X import ...` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(source: str, path: Path, node: ast.AST) -> list[str]:
    """The bertrain modules an import statement loads (`from pkg import sub` loads pkg.sub)."""
    known = modules()
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _resolve(source, path.name == "__init__.py", node)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    return sorted({name for name in names if name == "bertrain" or name.startswith("bertrain.")})


def _walk(source: str, path: Path, node: ast.AST, in_function: bool) -> list[Import]:
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found += [Import(source, target, path, child.lineno, in_function) for target in _targets(source, path, child)]
        else:
            found += _walk(source, path, child,
                           in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    return found


@functools.lru_cache(maxsize=None)
def imports() -> tuple[Import, ...]:
    """Every import of a bertrain module in the package."""
    found: list[Import] = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found += _walk(name, path, tree, in_function=False)
    return tuple(found)


# ----------------------------------------------------------------------------------------------
# Findings, one function per rule: each returns readable lines (empty when the rule holds)
# ----------------------------------------------------------------------------------------------


def unplaced_modules() -> list[str]:
    return [f"{path.relative_to(ROOT)}: {name} is in no row of LAYERS (add it to docs/architecture.md and here)"
            for name, path in modules().items() if layer(name) is None]


def layer_violations(scanned: tuple[Import, ...] | None = None) -> list[str]:
    found = []
    for imp in imports() if scanned is None else scanned:
        source_row, target_row = layer(imp.source), layer(imp.target)
        if source_row is None or target_row is None:
            continue
        if target_row > source_row:
            found.append(f"{imp.where()}: {imp.source} (row {source_row}) imports {imp.target} (row {target_row})")
        sides = {top_part(imp.source), top_part(imp.target)}
        if sides == set(NEVER_IMPORT_EACH_OTHER):
            found.append(f"{imp.where()}: {imp.source} imports {imp.target} (model and data never import each other)")
    return found


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, or one importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))
    return components


def import_cycles() -> list[str]:
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    where: dict[tuple[str, str], str] = {}
    for imp in imports():
        if imp.in_function or imp.target not in graph:
            continue
        graph[imp.source].add(imp.target)
        where.setdefault((imp.source, imp.target), imp.where())
    found = []
    for component in _strongly_connected(graph):
        members = set(component)
        edges = [f"{where[(a, b)]} ({a} -> {b})" for a in component for b in sorted(graph[a] & members)]
        found.append(f"cycle between {', '.join(component)}:\n    " + "\n    ".join(edges))
    return found


def function_level_imports() -> list[str]:
    return [f"{imp.where()}: {imp.source} imports {imp.target} inside a function (move it to the top of the module)"
            for imp in imports()
            if imp.in_function and not (imp.source + ".").startswith(LAZY_IMPORTS_ALLOWED_UNDER + ".")]


def oversized_modules() -> list[str]:
    found = []
    for name, path in modules().items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            found.append(f"{path.relative_to(ROOT)}: {lines} lines (limit {MAX_LINES})")
    return found


RULES = {
    "modules outside the layer table": unplaced_modules,
    "imports against the layer order": layer_violations,
    "import cycles (module-level imports)": import_cycles,
    "function-level imports of bertrain modules outside bertrain/cli/": function_level_imports,
    f"modules over {MAX_LINES} lines": oversized_modules,
}


def report(title: str, findings: list[str]) -> str:
    return f"{len(findings)} {title}:\n  " + "\n  ".join(findings)


# ----------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------


def test_the_scan_sees_the_package():
    # Guards the other tests against passing because they found nothing to check.
    assert {"bertrain.config", "bertrain.errors", "bertrain.cli", "bertrain.train.loop"} <= set(modules())
    assert any(imp.source == "bertrain.cli.config_commands" and imp.target == "bertrain.cli.app"
               for imp in imports())


def test_every_module_has_a_row():
    findings = unplaced_modules()
    assert not findings, report("modules outside the layer table", findings)


def test_imports_follow_the_layer_order():
    findings = layer_violations()
    assert not findings, report("imports against the layer order", findings)


def test_no_import_cycles():
    findings = import_cycles()
    assert not findings, report("import cycles (module-level imports)", findings)


def test_bertrain_modules_are_imported_at_module_top_outside_cli():
    findings = function_level_imports()
    assert not findings, report("function-level imports of bertrain modules outside bertrain/cli/", findings)


def test_modules_stay_small():
    findings = oversized_modules()
    assert not findings, report(f"modules over {MAX_LINES} lines", findings)


def test_every_module_is_named_in_docs_architecture():
    # docs/architecture.md is where a newcomer finds a concern's file: it must name every module.
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.name == "__init__.py" and relative.parent.name in ("data", "train", "sources"):
            continue  # package markers with nothing but a docstring
        named = f"`{relative.as_posix()}`" in text
        in_group = f"`{relative.parent.as_posix()}/`" in text and f"`{relative.name}`" in text  # `data/prepare/` (`x.py`)
        if not named and not (in_group and relative.name != "__init__.py"):
            missing.append(f"bertrain/{relative.as_posix()}")
    assert not missing, report("modules docs/architecture.md does not name", missing)


# The checks themselves, on small made-up packages, so a broken scanner cannot pass silently.


def test_cycle_finder_finds_cycles_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert sorted(_strongly_connected(graph)) == [["a", "b", "c"], ["e"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_layer_rule_flags_upward_and_model_data_imports():
    def imp(source: str, target: str) -> Import:
        return Import(source, target, PACKAGE / "x.py", 1, in_function=False)

    allowed = (imp("bertrain.train.loop", "bertrain.model"), imp("bertrain.cli.app", "bertrain.demo"),
               imp("bertrain.config.load", "bertrain.errors"), imp("bertrain.data.pairs", "bertrain.data.format"))
    assert layer_violations(allowed) == []
    flagged = layer_violations((imp("bertrain.config.validate", "bertrain.train.loop"),
                                imp("bertrain.model.bert", "bertrain.data.masking"),
                                imp("bertrain.data.loader", "bertrain.model")))
    assert len(flagged) == 3 and "row 1" in flagged[0] and "never import each other" in flagged[1]


def test_relative_imports_resolve_to_absolute_modules():
    node = ast.parse("from ..config import schema").body[0]
    assert _resolve("bertrain.train.loop", False, node) == "bertrain.config"
    assert _resolve("bertrain.train", True, ast.parse("from .loop import x").body[0]) == "bertrain.train.loop"


def test_walk_tells_module_level_from_function_level():
    tree = ast.parse("from bertrain.errors import ConfigError\n"
                     "if TYPE_CHECKING:\n    from bertrain.train import loop\n"
                     "def f():\n    import bertrain.data\n")
    found = {(imp.target, imp.in_function) for imp in _walk("bertrain.model.x", PACKAGE / "model" / "x.py", tree, False)}
    assert found == {("bertrain.errors", False), ("bertrain.train.loop", False), ("bertrain.data", True)}


if __name__ == "__main__":
    failures = 0
    for title, rule in RULES.items():
        findings = rule()
        failures += len(findings)
        print(report(title, findings) if findings else f"ok: no {title}")
    sys.exit(1 if failures else 0)
