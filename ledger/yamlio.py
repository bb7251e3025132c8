"""The bounded YAML reader every spec, graph and `--set` value goes through, with file:line
problems.

Contracts:
- `load_yaml(path)` / `load_yaml_text(text, where)` read one document bounded in size
  (MAX_YAML_BYTES), nesting (MAX_YAML_DEPTH) and alias expansion (MAX_YAML_NODES), UTF-8
  only, no duplicate keys, every number finite and within 64 bits; they return the data and
  its node tree (for line numbers).
- Every problem is a `SpecError` with one line each: `FILE:LINE: field.path: what is wrong`.
- `line_of(node, loc)` is the line of the deepest node along a location (keys and indexes);
  `dotted_path(loc)` shows the location as `a.b[2].c`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .numbers import bad_number
from .textfile import TextFileError, read_text

# Bounds on what a YAML document may cost to read: specs are a few kilobytes, so these are
# generous for any real file and stop an alias bomb or a runaway file early.
MAX_YAML_BYTES = 2 * 1024 * 1024  # the document's size on disk
MAX_YAML_NODES = 100_000  # nodes after alias expansion (`*a` counts the whole of `&a`)
MAX_YAML_DEPTH = 64  # nesting of sequences and mappings


class _Loader(yaml.SafeLoader):
    """The safe loader, bounded: refuses a recursive alias (`&a [*a]`), nesting deeper than
    MAX_YAML_DEPTH and a document whose alias expansion exceeds MAX_YAML_NODES, each as a
    marked YAML error (so with a line) before anything is constructed."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._open_anchors: set[str] = set()  # anchors whose node is being composed
        self._sizes: dict[int, int] = {}  # id(node) -> its size with aliases expanded
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                # The stubs type an event's mark as the C or the Python Mark; the error takes
                # either at run time.
                raise yaml.composer.ComposerError(
                    None, None, f"recursive alias *{event.anchor} (an anchor may not contain "
                    "itself)", event.start_mark)  # type: ignore[arg-type]
            return super().compose_node(parent, index)
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark)
        anchor = event.anchor
        if anchor is not None:
            self._open_anchors.add(anchor)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors.discard(anchor)
        assert node is not None  # composing an event gives a node
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(self._sizes.get(id(v), 1) for v in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1)
                        for k, v in node.value)
        if size > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"document expands to more than {MAX_YAML_NODES} values "
                "(aliases repeat whole anchored values)", node.start_mark)
        self._sizes[id(node)] = size
        return node


def _yaml_problem(path: Path, e: yaml.YAMLError) -> SpecError:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 0
        return SpecError([f"{path}:{line}: (yaml): {' '.join(str(e.problem or e).split())}"])
    return SpecError([f"{path}:0: (yaml): {' '.join(str(e).split())}"])


def _compose(path: Path, text: str) -> yaml.Node | None:
    """The document's node tree (bounded, see `_Loader`); YAML errors as a one-line SpecError."""
    try:
        loader = _Loader(text)  # the reader checks the characters here already
    except yaml.reader.ReaderError as e:
        line = text[:e.position].count("\n") + 1
        raise SpecError([f"{path}:{line}: (yaml): character {e.character:#x} is not allowed "
                         "in YAML (binary data?)"]) from None
    try:
        return loader.get_single_node()
    except yaml.reader.ReaderError as e:
        raise SpecError([f"{path}:0: (yaml): character {e.character:#x} is not allowed in "
                         "YAML (binary data?)"]) from None
    except yaml.YAMLError as e:
        raise _yaml_problem(path, e) from None
    finally:
        loader.dispose()


def _construct(path: Path, node: yaml.Node) -> Any:
    loader = _Loader("")
    try:
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise _yaml_problem(path, e) from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. `!!timestamp 2024-13-45`
        raise SpecError([f"{path}:0: (yaml): {' '.join(str(e).split())}"]) from None
    finally:
        loader.dispose()


def _duplicates(path: Path, node: yaml.Node | None, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            key = str(k.value)
            p = f"{prefix}.{key}" if prefix else key
            if key in seen:
                out.append(f"{path}:{k.start_mark.line + 1}: {p}: duplicate key")
            seen.add(key)
            out += _duplicates(path, v, p)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out += _duplicates(path, v, f"{prefix}[{i}]")
    return out


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int:
    """Line (1-based) of the deepest YAML node along a pydantic error location."""
    if node is None:
        return 1
    best = node.start_mark.line + 1
    for part in loc:
        nxt = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(k.value) == str(part):
                    nxt = v
                    best = k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if 0 <= part < len(node.value):
                nxt = node.value[part]
                best = nxt.start_mark.line + 1
        if nxt is None:
            break
        node = nxt
    return best


# Labels pydantic puts into error locations for union branches: not field names.
_UNION_LABELS = {"list-values", "range-values", "int", "Distribution", "list[Any]"}


def dotted_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part) in _UNION_LABELS:
            continue  # union-branch labels pydantic adds to locations
        else:
            out += ("." if out else "") + str(part)
    return out or "(top)"


def _read_text(p: Path) -> str:
    try:
        return read_text(p, MAX_YAML_BYTES, "a YAML spec")
    except TextFileError as e:
        raise SpecError([f"{p}:{e.line}: (file): {e}"]) from None


def number_problems(path: str | Path, data: Any, node: yaml.Node | None) -> list[str]:
    """A one-line problem for the first number in `data` the ledger cannot hold (NaN, an
    infinity, a float too large such as 1e400, an integer over 64 bits), or []."""
    bad = bad_number(data)
    if bad is None:
        return []
    loc, why = bad
    return [f"{path}:{line_of(node, loc)}: {dotted_path(loc)}: {why}"]


def load_yaml(path: str | Path) -> tuple[Any, yaml.Node | None]:
    """Read one YAML document: bounded in size, depth and alias expansion, UTF-8 only, no
    duplicate keys, every number finite and within 64 bits. Raises SpecError (file:line)."""
    p = Path(path)
    return load_yaml_text(_read_text(p), p)


def load_yaml_text(text: str, where: str | Path) -> tuple[Any, yaml.Node | None]:
    """`load_yaml` for YAML given as text (a `--set KEY=VALUE` value): the same bounds and
    checks; problems name `where`."""
    p = Path(where)
    if len(text) > MAX_YAML_BYTES:
        raise SpecError([f"{p}:0: (yaml): longer than {MAX_YAML_BYTES >> 20} MiB"])
    node = _compose(p, text)
    dups = _duplicates(p, node)
    if dups:
        raise SpecError(dups)
    data = _construct(p, node) if node is not None else None
    bad = number_problems(p, data, node)
    if bad:
        raise SpecError(bad)
    return data, node
