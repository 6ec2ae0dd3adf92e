"""The import structure: no loops between notifyq's modules, and every module in a layer of the
import-linter contract (pyproject.toml), which `.ci/run` checks with `lint-imports`."""

from __future__ import annotations

import tomllib

import grimp

from tests.support import ROOT


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("notifyq", include_external_packages=False)


def test_no_module_of_notifyq_imports_itself_back_through_others() -> None:
    graph = _graph()
    loops = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                loops.append(graph.find_shortest_chain(importer=imported, imported=module))
    assert loops == []


def test_every_module_sits_in_a_layer_of_the_import_contract() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [c for c in project["tool"]["importlinter"]["contracts"]
                  if c["type"] == "layers"]
    listed = {name.strip() for layer in contract["layers"]
              for name in layer.replace(":", "|").split("|")}
    packages = {".".join(p.relative_to(ROOT).parent.parts)
                for p in (ROOT / "notifyq").rglob("__init__.py")}  # their __init__ holds no code
    outside = [m for m in sorted(_graph().modules)
               if m not in packages and not any(m == name or m.startswith(name + ".")
                                                for name in listed)]
    assert outside == []
