"""What notifyq imports at run time is what pyproject.toml makes pip install.

Every third-party module that a file under notifyq/ imports (at module level or lazily inside a
function) must come from a distribution in ``[project] dependencies``, directly or through an
extra of one (``psycopg[pool]`` brings ``psycopg_pool``). The only exception is an *optional*
import: inside ``try: ... except ImportError`` (the guard turns a missing package into an error
that says what to install); its distribution must then be in a documented extra that is not the
``test`` one. Imports under ``if TYPE_CHECKING:`` never run and are ignored.
"""

from __future__ import annotations

import ast
import functools
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import ROOT

DEV_EXTRAS = {"test"}


@dataclass(frozen=True)
class Imported:
    module: str
    """The top-level module name (``psycopg_pool`` for ``from psycopg_pool import X``)."""
    where: str
    optional: bool


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in {"ImportError", "ModuleNotFoundError"}
               for n in names)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST, where: Path, *, optional: bool = False) -> Iterator[Imported]:
    """The absolute imports under ``node``, each marked optional when an ``except
    ImportError`` guards it."""
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for branch in node.orelse:
            yield from _imports(branch, where, optional=optional)
        return
    if isinstance(node, ast.Try):
        guarded = optional or any(_catches_import_error(h) for h in node.handlers)
        for statement in node.body:
            yield from _imports(statement, where, optional=guarded)
        for part in (*node.handlers, *node.orelse, *node.finalbody):
            yield from _imports(part, where, optional=optional)
        return
    if isinstance(node, ast.Import | ast.ImportFrom):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
            [node.module] if node.level == 0 and node.module else [])
        for name in names:
            yield Imported(name.partition(".")[0], f"{where.relative_to(ROOT)}:{node.lineno}",
                           optional)
    for child in ast.iter_child_nodes(node):
        yield from _imports(child, where, optional=optional)


def third_party_imports() -> list[Imported]:
    found = []
    for path in sorted((ROOT / "notifyq").rglob("*.py")):
        for imported in _imports(ast.parse(path.read_text(), str(path)), path):
            if imported.module not in sys.stdlib_module_names and imported.module != "notifyq":
                found.append(imported)
    return found


def _with_extras(requirements: list[str]) -> set[str]:
    """The distribution names of ``requirements`` plus what their extras pull in
    (``psycopg[pool]`` -> psycopg, psycopg-pool)."""
    names: set[str] = set()
    for text in requirements:
        requirement = Requirement(text)
        names.add(canonicalize_name(requirement.name))
        for extra in requirement.extras:
            for dependency in metadata.requires(requirement.name) or []:
                pulled = Requirement(dependency)
                if pulled.marker is not None and pulled.marker.evaluate({"extra": extra}):
                    names.add(canonicalize_name(pulled.name))
    return names


@functools.cache
def _installed() -> dict[str, list[str]]:
    """Top-level module -> the installed distributions that provide it."""
    return dict(metadata.packages_distributions())


def _distributions(module: str) -> set[str]:
    return {canonicalize_name(d) for d in _installed().get(module, [])}


def _project() -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_every_module_notifyq_imports_at_run_time_is_a_declared_dependency() -> None:
    project = _project()
    runtime = _with_extras(project["dependencies"])  # type: ignore[arg-type]
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    optional = _with_extras([r for name, reqs in extras.items() if name not in DEV_EXTRAS
                             for r in reqs])
    imports = third_party_imports()
    assert {i.module for i in imports} >= {"psycopg", "fastapi", "httpx"}  # the scan sees them

    missing = []
    for imported in imports:
        distributions = _distributions(imported.module)
        allowed = runtime | optional if imported.optional else runtime
        if not distributions & allowed:
            kind = "an extra" if imported.optional else "[project] dependencies"
            missing.append(f"{imported.where}: {imported.module} "
                           f"({', '.join(sorted(distributions)) or 'not installed'}) "
                           f"is not in {kind}")
    assert not missing, "\n".join(missing)


def test_every_declared_dependency_is_imported_by_notifyq() -> None:
    project = _project()
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    declared = [*project["dependencies"],  # type: ignore[misc]
                *(r for name, reqs in extras.items() if name not in DEV_EXTRAS for r in reqs)]
    imported = set().union(*(_distributions(i.module) for i in third_party_imports()))
    unused = [r for r in declared if canonicalize_name(Requirement(r).name) not in imported]
    assert not unused, f"declared but never imported by notifyq/: {unused}"


# Python reads a None in sys.modules as "not installed": `import opentelemetry` raises
# ImportError, as in an install without the `otel` extra.
WITHOUT_OTEL = "import sys; sys.modules['opentelemetry'] = None; "


def test_notifyq_imports_and_its_tracing_hooks_are_no_ops_without_opentelemetry() -> None:
    import subprocess

    script = WITHOUT_OTEL + (
        "import notifyq, notifyq._tracing as t, notifyq._dispatch.worker, "
        "notifyq._webhooks.deliver, notifyq._keys.reencrypt\n"
        "assert not t._API and not t.enabled()\n"
        "with t.sending('x') as s: assert s is None\n"
        "with t.processing(lambda: 1/0) as p: assert p is None\n"  # never builds the claim
        "with t.child_span('step', {}) as c: assert c is None\n"
        "t.finished('x', 'default', 'completed', 0.1); t.webhook_attempt('2xx')\n"
        "print('ok', 'opentelemetry' in sys.modules and sys.modules['opentelemetry'] is None)")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "True"]
