"""The package's shape: no import circles, folders in layers, and modules small enough to read (issues "One
scheduler, two clocks" and "Seams to build on").

The import graph is read with ``ast`` from the source, not by importing it. An import counts wherever it is (a
lazy import inside a function closes a circle as well as one at the top; so does one under ``if TYPE_CHECKING:``,
since a type names what it depends on), except a lazy import whose line says ``# optional dependency`` (it gates a
package the user may not have installed, and cannot run before that package is asked for)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "optuna_saturn"
OPTIONAL = "# optional dependency"
#: The loop, each policy, and every module, in lines.
LOOP_LINES, POLICY_LINES, MODULE_LINES = 250, 200, 400
POLICIES = (
    "policy",
    "asking",
    "options",
    "planning",
    "dispatch",
    "profiling",
    "faults",
    "elastic",
    "outcomes",
    "releasing",
    "unstarted",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module an import of ``name`` runs: itself, or the package that holds it (a name defined there)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def import_graph(*, type_only: bool = True) -> dict[str, set[str]]:
    """Module -> the modules it imports; ``type_only=False`` leaves out imports under ``if TYPE_CHECKING:``."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        source = path.read_text(encoding="utf-8")
        tree, lines = ast.parse(source), source.splitlines()
        skipped = set() if type_only else _type_checking_lines(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skipped:
                continue
            if OPTIONAL in lines[node.lineno - 1]:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the importing module's package
                    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target.split(".")[0] != "optuna_saturn":
                    continue
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != name:
                    graph[name].add(resolved)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the package's top-level modules and folders (``optuna_saturn.sweep`` for everything in
    ``sweep/``); the package's ``__init__`` is left out (it only hands names on)."""

    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    between: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "optuna_saturn":
            continue
        between.setdefault(room(module), set()).update(
            room(t) for t in targets if t != "optuna_saturn" and room(t) != room(module)
        )
    return between


def test_the_package_has_no_import_circle_type_only_ones_included():
    assert circles(import_graph()) == []


def test_only_pools_know_which_kinds_of_pool_there_are():
    """A kind of pool is an object of the ``PoolKind`` protocol: outside ``pools/`` nothing imports a kind or its
    workers, only the protocol (``pools.kinds``) and the names ``runner=`` gives them (``pools.registry``); so a new
    kind touches ``pools/`` and nothing else."""
    kinds_inside = {"local_kind", "ray_kind", "ray", "ray_cluster", "ray_nodes", "ray_actor", "ray_lease", "warm"}
    kinds_inside |= {"slurm_kind", "slurm", "slurm_node", "slurm_allocation", "slurm_host", "slurm_job"}
    kinds_inside |= {"slurm_request"}
    outside = {
        (module, imported)
        for module, edges in import_graph().items()
        if not module.startswith("optuna_saturn.pools")
        for imported in edges
        if imported.rsplit(".", 1)[-1] in kinds_inside and imported.startswith("optuna_saturn.pools.")
    }
    assert outside == set()


def test_folders_and_top_level_modules_stand_in_layers():
    """No folder imports a module that imports it back, through any path: every import runs down."""
    assert circles(rooms(import_graph())) == []


def test_a_type_only_import_and_a_marked_optional_one_are_left_out(tmp_path, monkeypatch):
    package = tmp_path / "optuna_saturn"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from optuna_saturn.b import B\n"
    )
    (package / "b.py").write_text(
        f"def f():\n    from optuna_saturn.a import A  {OPTIONAL}: ray\nfrom optuna_saturn import a\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    graph = import_graph(type_only=False)
    assert graph["optuna_saturn.a"] == set() and graph["optuna_saturn.b"] == {"optuna_saturn.a"}
    assert import_graph()["optuna_saturn.a"] == {"optuna_saturn.b"}


def test_the_loop_the_policies_and_every_module_are_small():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in _modules().items()}
    assert sizes["optuna_saturn.sweep.loop"] <= LOOP_LINES
    assert {
        p: sizes[f"optuna_saturn.sweep.{p}"] for p in POLICIES if sizes[f"optuna_saturn.sweep.{p}"] > POLICY_LINES
    } == {}
    assert {n: s for n, s in sizes.items() if s > MODULE_LINES} == {}
