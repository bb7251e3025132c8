"""The house's import rules, read from the code itself (ARCHITECTURE.md): every import of the
package's own modules, at the top of a file or inside a function, is an arrow.

- The floors: `entry.py` (the console script) > `cli.py` > `harness/`, `wiki/` >
  `projections/`, `repos/` > `ledger/`; nothing imports a floor above its own, and
  `harness/` and `wiki/` never import each other.
- No circle of modules, and no circle of rooms (a room: a subpackage of `harness/` or
  `ledger/`, or one of their top-level modules), counting in-function imports: a circle hidden
  inside a function body is still a circle.
- An in-function import of the package's own code is there for start-up time, and says so:
  a comment naming "start-up time" on its line or just above its group of imports (cli.py:
  one module-level statement covers its commands' imports).
- No `_private` name crosses a module: no module imports another module's `_name` (relative
  or absolute), nor reads `module._name` through a module of the package it imported.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PKG = "infer_forge"
SKIP = {"tests", "bench", "notebooks", "examples", "docs", ".venv"}
FLOOR = {"entry": 5, "cli": 4, "harness": 3, "wiki": 3, "projections": 2, "repos": 2,
         "ledger": 1}


def modules() -> dict[str, Path]:
    out = {}
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in SKIP or any(p.startswith(".") for p in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def resolve(name: str, path: Path, node: ast.ImportFrom) -> str | None:
    """The package module (dotted, without `infer_forge.`) an ImportFrom in module `name`
    (at `path`) imports from; None for an import from outside the package."""
    if node.level:
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
        return ".".join([*base, *(node.module.split(".") if node.module else [])])
    if node.module and node.module.startswith(PKG + "."):
        return node.module[len(PKG) + 1:]
    return None


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in the file)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                stem = resolve(name, path, node)
                if stem is None:
                    continue
                targets = [f"{stem}.{a.name}" if stem else a.name for a in node.names] + [stem]
            elif isinstance(node, ast.Import):
                targets = [a.name[len(PKG) + 1:] for a in node.names
                           if a.name.startswith(PKG + ".")]
            for t in targets:
                while t and t not in mods:  # `from .x import name`: the module x
                    t = t.rpartition(".")[0]
                if t and t != name and not (is_pkg and t.startswith(name + ".")):
                    graph[name].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] in ("harness", "ledger") and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def test_no_floor_imports_a_floor_above_it():
    graph = imports(modules())
    wrong = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs
                   if FLOOR.get(b.split(".")[0], 0) > FLOOR.get(a.split(".")[0], 0)
                   or {a.split(".")[0], b.split(".")[0]} == {"harness", "wiki"})
    assert wrong == []


def test_no_circle_of_modules():
    assert circles(imports(modules())) == []


def test_no_circle_of_rooms_inside_harness_and_ledger():
    rooms: dict[str, set[str]] = defaultdict(set)
    for a, bs in imports(modules()).items():
        for b in bs:
            if room(a) != room(b) and a.split(".")[0] == b.split(".")[0] \
                    and a.split(".")[0] in ("harness", "ledger"):
                rooms[room(a)].add(room(b))
    assert circles(rooms) == []


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_crossings(mods: dict[str, Path]) -> list[str]:
    """Each place a module imports another module's `_name`, or reads `module._name` through
    a module of the package it imported (`from . import evidence` … `evidence._x`;
    `import infer_forge.a.b as b` … `b._x`)."""
    out = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own_modules: set[str] = set()  # local names bound to one of the package's modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                stem = resolve(name, path, node)
                if stem is None:
                    continue
                for a in node.names:
                    if private(a.name):
                        out.append(f"{path.relative_to(REPO)}:{node.lineno}: imports {a.name}"
                                   f" from {stem or PKG}")
                    if (f"{stem}.{a.name}" if stem else a.name) in mods:
                        own_modules.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith(PKG + ".") and a.asname:
                        own_modules.add(a.asname)
                    if any(private(part) for part in a.name.split(".")[1:]):
                        out.append(f"{path.relative_to(REPO)}:{node.lineno}: imports {a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in own_modules and private(node.attr):
                out.append(f"{path.relative_to(REPO)}:{node.lineno}: reads "
                           f"{node.value.id}.{node.attr}")
    return sorted(out)


def test_no_private_name_crosses_a_module():
    assert private_crossings(modules()) == []


REASON = "start-up time"
# Modules whose in-function imports one module-level comment covers, in these words.
MODULE_WIDE = {"cli": "every in-function import in this module is for start-up time"}


def _comments(lines: list[str]) -> str:
    return " ".join(line.partition("#")[2] for line in lines if "#" in line).lower()


def unexplained_in_function_imports(mods: dict[str, Path]) -> list[str]:
    """Each in-function import of the package's own code with no start-up reason: none on
    its group's lines (consecutive imports of one block) nor in the comment lines above it."""
    out = []
    for name, path in mods.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        wide = MODULE_WIDE.get(name)
        if wide and any(line.startswith("#") and wide in line.lower() for line in lines):
            continue  # a comment at column 0: the module's own statement
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for block in ast.walk(fn):
                for field in ("body", "orelse", "finalbody"):
                    stmts = getattr(block, field, None)
                    if not isinstance(stmts, list):
                        continue
                    group: list[ast.stmt] = []
                    for stmt in [*stmts, None]:
                        if isinstance(stmt, ast.Import | ast.ImportFrom):
                            group.append(stmt)
                            continue
                        own = [s for s in group if _own(name, path, s)]
                        if own:
                            above = group[0].lineno - 1  # the group's first line, 0-based
                            while above > 0 and lines[above - 1].strip().startswith("#"):
                                above -= 1
                            if REASON not in _comments(lines[above:group[-1].end_lineno]):
                                out += [f"{path.relative_to(REPO)}:{s.lineno}: "
                                        f"{lines[s.lineno - 1].strip()}" for s in own]
                        group = []
    return sorted(set(out))


def _own(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return resolve(name, path, node) is not None
    return any(a.name.startswith(PKG + ".") for a in node.names)


def test_an_in_function_import_of_the_package_says_it_is_for_start_up_time():
    assert unexplained_in_function_imports(modules()) == []
