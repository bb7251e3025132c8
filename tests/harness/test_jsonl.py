"""One JSONL reader: every JSONL input (a custom dataset, bench_serving results, a stored
artifact) fails the same way on the same bad line, naming file and line; the last JSON line
of a command's stdout is read one way by the evaluator, the executor and graph nodes."""

from __future__ import annotations

import pytest
from infer_forge.harness.bench.datasets import custom_prompts
from infer_forge.harness.bench.importer import iter_results
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.graph.work import last_json
from infer_forge.harness.jsonl import iter_jsonl, iter_jsonl_text, last_json_line
from infer_forge.harness.loop.command_evaluator import parse_metrics_line

GOOD = b'{"prompt": "a", "output_len": 2, "completed": 1}\n'

BAD = {
    "malformed": (b"{oops\n", ":1: malformed JSON (Expecting property name"),
    "truncated": (b'{"a": 1\n', ":1: malformed JSON"),
    "binary": (b"\xff\xfe\x00\x01\n", ":1: not UTF-8 text"),
    "deep": (b"[" * 100_000 + b"\n", ":1: malformed JSON"),
}


def _readers():
    return {
        "iter_jsonl": lambda p: list(iter_jsonl(p)),
        "custom_prompts": lambda p: custom_prompts(p),
        "bench import": lambda p: list(iter_results(p)),
    }


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("reader", sorted(_readers()))
def test_every_jsonl_input_names_the_bad_line_the_same_way(tmp_path, case, reader):
    line, says = BAD[case]
    f = tmp_path / "in.jsonl"
    f.write_bytes(line + GOOD)  # the bad line first: every reader meets it
    with pytest.raises(HarnessError) as ei:
        _readers()[reader](f)
    msg = str(ei.value)
    assert msg.startswith(f"{f}{says}"), msg
    assert "\n" not in msg


def test_blank_lines_are_skipped_and_numbered(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_bytes(b"\n" + GOOD + b"   \n" + b'{"b": 2}\n')
    assert [no for no, _ in iter_jsonl(f)] == [2, 4]
    assert [v for _, v in iter_jsonl_text([b"", b'{"a": 1}'], "artifact x")] == [{"a": 1}]
    with pytest.raises(HarnessError, match=r"^artifact x:2: malformed JSON"):
        list(iter_jsonl_text([b"{}", b"{"], "artifact x"))


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(HarnessError, match=r"^cannot read .*nope\.jsonl: No such file"):
        list(iter_jsonl(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize(("stdout", "value", "why"), [
    ('log line\n{"x": 1}\n\n', {"x": 1}, None),
    ("[1, 2]", [1, 2], None),
    ("", None, "no output on stdout"),
    ("  \n\n", None, "no output on stdout"),
    ('{"x": 1}\nnot json\n', None, "last stdout line is not JSON"),
    ("[" * 100_000, None, "last stdout line is not JSON: nested too deeply"),
])
def test_last_json_line_one_reader_for_every_command_output(stdout, value, why):
    if why is None:
        assert last_json_line(stdout) == value
    else:
        with pytest.raises(ValueError, match=why):
            last_json_line(stdout)
    # The graph's node metrics and the evaluator's metrics read the same line.
    assert last_json(stdout) == (value if isinstance(value, dict) else None)
    if isinstance(value, dict):
        assert parse_metrics_line(stdout)[0] == {"x": 1.0}
    else:
        with pytest.raises(ValueError):
            parse_metrics_line(stdout)
