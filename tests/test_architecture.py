"""ARCHITECTURE.md matches the code where the code can say so: rule 1 ("Who writes which
stream") names every stream kind of ledger/streams.py, and the order of the rooms inside
`harness/` names every room and holds for every import (in-function ones included): a room
imports only rooms of the tiers below its own."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

from .test_import_graph import imports, modules, room

DOC = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")


def stream_kinds() -> dict[str, str]:
    """ledger/streams.py's constants (`*_STREAM` names, `*_PREFIX` prefixes) -> their value."""
    tree = ast.parse((REPO / "ledger" / "streams.py").read_text(encoding="utf-8"))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.endswith(("_STREAM", "_PREFIX")) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out[node.targets[0].id] = node.value.value
    return out


def rule(number: int) -> str:
    m = re.search(rf"^{number}\. \*\*.*?(?=^{number + 1}\. \*\*)", DOC, re.M | re.S)
    assert m, f"ARCHITECTURE.md has no rule {number}"
    return m.group(0)


def test_rule_1_names_every_stream_kind_of_the_ledger():
    kinds = stream_kinds()
    assert {"TASK_PREFIX", "AGENTS_STREAM", "COMMAND_PREFIX"} <= set(kinds)  # the parse saw them
    text = " ".join(rule(1).split())
    # A stream is named as `name`; a family of streams by its prefix, as `prefix:<id>`.
    missing = sorted(name for name, v in kinds.items()
                     if (f"`{v}<" if v.endswith(":") else f"`{v}`") not in text)
    assert missing == []


def room_order() -> list[set[str]]:
    """The rooms of `harness/` in ARCHITECTURE.md's order, bottom to top: tiers split by →."""
    m = re.search(r"Inside `harness/` the rooms stand in this order.*?:(.*?)\.", DOC, re.S)
    assert m, "ARCHITECTURE.md states no order of the rooms inside harness/"
    return [set(re.findall(r"`(\w+)`", tier)) for tier in m.group(1).split("→")]


def test_the_order_of_the_harness_rooms_names_every_room_and_holds():
    tiers = room_order()
    tier_of = {r: i for i, tier in enumerate(tiers) for r in tier}
    graph = imports(modules())
    rooms = {room(m).split(".")[1] for m in modules()
             if m.startswith("harness.") and m.count(".") >= 1}
    assert sorted(rooms - set(tier_of)) == []  # every room has its place
    assert sorted(set(tier_of) - rooms) == []  # and the order names no room that is gone
    # A room imports only rooms below it: not its own tier's others, not above.
    not_below = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs
                       if a.startswith("harness.") and b.startswith("harness.")
                       and room(a) != room(b)
                       and tier_of[room(b).split(".")[1]] >= tier_of[room(a).split(".")[1]])
    assert not_below == []
