"""The house's shape, as docs/development.md draws it: a folder imports only folders below it in
that page's list (util/, errors.py and flags.py are the ground floor every folder may import, and
they import nothing else of the house), and no module imports its way back to itself. Imports made
inside functions count: a lazy import still ties two folders together."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "hermes_batch"
GROUND = ("util", "errors", "flags")


def rooms_in_order() -> list[str]:
    """The rooms of the package, top floor first, as the development page lists them."""
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    tree = page.split("```")[1]
    names = [m.group(1) for m in re.finditer(r"^ {0,2}([a-z_]+)(?:/|\.py)\s", tree, re.M)]
    return [n for n in names if n not in ("batch_runner", "data", "tests", "benchmarks", "scripts")]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["hermes_batch", *parts])


def imports_of(path: Path, name: str) -> set[str]:
    """The modules of the house `path` imports, anywhere in it, as absolute names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hermes_batch"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("hermes_batch"):
                continue
            # `from . import x` names a module when x is one
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists()
                        or (PACKAGE.parent / sub.replace(".", "/")).is_dir() else target)
    return out


def modules() -> dict[str, set[str]]:
    found = {}
    for folder, _, files in os.walk(PACKAGE, followlinks=True):  # backends/ and distributions/ are links
        for file in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / file
            found[module_name(path)] = imports_of(path, module_name(path))
    assert "hermes_batch.backends.base" in found and "hermes_batch.distributions" in found
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_import_points_down_the_development_page_s_list_of_folders():
    order = rooms_in_order()
    rank = {name: i for i, name in enumerate(order)}
    graph = modules()
    unlisted = sorted({room(m) for m in graph} - set(rank) - set(GROUND) - {""})
    assert not unlisted, f"rooms the development page does not list: {unlisted}"
    upward = []
    for module, imported in graph.items():
        here = room(module)
        for target in imported:
            there = room(target)
            if there in ("", here):
                continue
            if here in GROUND:
                if there not in GROUND:
                    upward.append(f"{module} -> {target} (the ground floor imports nothing above it)")
            elif there not in GROUND and rank[there] <= rank[here]:
                upward.append(f"{module} -> {target} ({there} is not below {here} on the page)")
    assert not upward, "imports pointing up:\n" + "\n".join(sorted(upward))


def test_no_module_imports_its_way_back_to_itself():
    graph = modules()
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for target in sorted(graph.get(module, ())):
            if target not in graph or target == module:
                continue
            if seen.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in seen:
                visit(target, [*path, target])
        seen[module] = 2

    for module in graph:
        if module not in seen:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
