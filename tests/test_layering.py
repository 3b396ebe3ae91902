"""The package's layering, read from its source: modules keep their private names to
themselves, nothing imports in a circle, and the stores build on values, never on the actor
(see docs/internals.md, "The layers")."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import nous_session

_ROOT = Path(nous_session.__file__).parent

# What a store may import from outside nous_session.stores: the values it stores and reads,
# errors, logging and the event-loop primitives. The actor, its engine, the registry and the
# compaction machinery are above the stores.
_BELOW_THE_STORES = frozenset(
    {
        "nous_session",  # the package itself only as a parent of the modules below
        "nous_session._json",
        "nous_session._logging",
        "nous_session._loops",
        "nous_session._part_types",
        "nous_session._parts_stored",
        "nous_session._trusted",
        "nous_session.codec",
        "nous_session.encryption",
        "nous_session.erasure",
        "nous_session.errors",
        "nous_session.event",
        "nous_session.listing",
        "nous_session.message",
        "nous_session.metadata",
        "nous_session.ops",
        "nous_session.parts",
    }
)


def _modules() -> dict[str, ast.Module]:
    modules = {}
    for path in sorted(_ROOT.rglob("*.py")):
        parts = ["nous_session", *path.relative_to(_ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return modules


_MODULES = _modules()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _runtime_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _imports(tree: ast.Module) -> Iterator[tuple[str, str | None]]:
    """(module, name) of each nous_session import run at some point (a local one too):
    ``from m import n`` gives (m, n), ``import m`` gives (m, None)."""
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "nous_session":
                for alias in node.names:
                    yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "nous_session":
                    yield alias.name, None


def _module_of(module: str, name: str | None) -> str:
    """The module an import reaches: ``from package import submodule`` is the submodule."""
    if name is not None and f"{module}.{name}" in _MODULES:
        return f"{module}.{name}"
    return module


def test_no_module_uses_another_modules_private_names() -> None:
    """A name another module needs is part of its module's interface, and named so (private
    modules have public names for the package to use)."""
    used = []
    for importer, tree in _MODULES.items():
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in _MODULES:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in _MODULES:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    elif _private(alias.name):
                        used.append(f"{importer} imports {node.module}.{alias.name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and f"{aliases[node.value.id]}.{node.attr}" not in _MODULES
            ):
                used.append(f"{importer} reads {aliases[node.value.id]}.{node.attr}")
    assert used == []


def test_no_import_cycle() -> None:
    """No module imports, even from inside a function, one that imports it back (the parent
    packages a module's import runs first are not counted as its imports)."""
    graph = {
        module: {
            target
            for imported, name in _imports(tree)
            if (target := _module_of(imported, name)) != module
            and not module.startswith(target + ".")
        }
        for module, tree in _MODULES.items()
    }
    cycles = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


def test_the_stores_import_nothing_above_them() -> None:
    above = sorted(
        f"{module} imports {target}"
        for module, tree in _MODULES.items()
        if module.startswith("nous_session.stores")
        for imported, name in _imports(tree)
        if not (target := _module_of(imported, name)).startswith("nous_session.stores")
        and target not in _BELOW_THE_STORES
    )
    assert above == []


def test_the_checks_see_the_package() -> None:
    """The tests above read the modules they should: the whole package, with its imports."""
    assert len(_MODULES) > 100
    assert "nous_session.stores.sqlite._store" in _MODULES
    imported = {module for tree in _MODULES.values() for module, _ in _imports(tree)}
    assert "nous_session.stores.base" in imported
