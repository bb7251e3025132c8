"""Split secrets: a secret split across a JSON key and its value, across two output lines (a
header and its value, a token or a PEM wrapped at a fixed width, a child writing a token in
two writes), across the chunks of a streamed artifact, is still redacted; and a secret in a
point, profile or task YAML is refused at definition with the field named, nothing
recorded."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import orjson
import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.secrets.locate import locate
from infer_forge.ledger.secrets.names import redact_assignments
from infer_forge.ledger.secrets.redactor import Redactor
from infer_forge.ledger.secrets.stream import StreamRedactor
from infer_forge.ledger.workspace import open_workspace

from tests.conftest import REPO, run_forge

from ..harness.loop.test_loop import make_task_dir
from .test_redact import SGLANG_LOG

V = "q7Wz-Lp3Xr9_Mn2B"  # a value under a secret name
HF = "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"
GH = "ghp_" + "a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6q7r8"
SK = "sk-proj-" + "Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78St90"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
B64 = "dXNlcjpjb3JyZWN0LWhvcnNlLWJhdHRlcnk="
PEM_BODY = ["MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
            "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK",
            "kJvQ3hXrNP5gG1fTzVw8cPLoyTbXBfW3qj7mAoY5Ix6sD9uRkEhZQ2Ny4MaCtHe0"]
PEM = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(PEM_BODY) + "\n-----END RSA PRIVATE KEY-----"


def wrap(token: str, width: int, indent: str = "") -> str:
    return "\n".join(indent + token[i:i + width] for i in range(0, len(token), width))


def pieces(token: str, width: int) -> list[str]:
    return [token[i:i + width] for i in range(0, len(token), width)]


@pytest.fixture(scope="module")
def red() -> Redactor:
    return Redactor()


# --- across a JSON key and its value --------------------------------------------------------

KEY_VALUE = [
    # The head of a token as the key, the rest as the value (a `k:v` or `k=v` split).
    ({"sk-proj-Ab12Cd34": SK[len("sk-proj-Ab12Cd34"):]}, ["Ab12Cd34", SK[-20:]]),
    ({GH[:12]: GH[12:]}, [GH[4:12], GH[12:]]),
    ({"Bearer": "abcdefghijklmnopqrstuvwx"}, ["abcdefghijklmnopqrstuvwx"]),
    # A whole token as the key and more of it as the value.
    ({SK[:30]: SK[30:]}, [SK[8:30], SK[30:]]),
    # A name under one key and its value under another, and a [name, value] pair.
    ({"name": "DB_PASSWORD", "value": V}, [V]),
    ({"headers": [["Authorization", f"Basic {B64}"]]}, [B64]),
    ({"env": [["MY_API_KEY", V], ["PATH", "/usr/bin"]]}, [V]),
]


@pytest.mark.parametrize(("doc", "gone"), KEY_VALUE)
def test_a_secret_split_across_a_key_and_its_value_is_redacted(red, workspace, doc, gone):
    assert red.has_secret(doc)
    out = orjson.dumps(red.value(doc))
    for part in gone:
        assert part.encode() not in out, part
    assert red.json_bytes(orjson.dumps(doc)) == out
    assert locate(red, doc)  # where, for the spec check and the scan
    # Through the ledger: nothing of it reaches the stored bytes.
    ev = E.MeasurementRecorded(task_id="t", block_id="b1", run_id="r1", source="s",
                               metrics={"x": 1.0}, meta={"doc": doc})
    saved = workspace.ledger.append("task:t", [ev])
    raw = workspace.ledger.raw_state(saved.positions[0])
    for part in gone:
        assert part.encode() not in raw, part
    assert b'"PATH"' in raw or "env" not in doc  # the ordinary entry beside it is kept


def test_ordinary_keys_and_pairs_stay_intact(red):
    ordinary = {"name": "PATH", "value": "/usr/bin", "Bearer": "x", "skills": ["a", "b"],
                "argv": ["passwd", "alice"], "pair": ["password", "reset"],
                "key": "sort_key", "sha256:abc": "def", "headers": [["Accept", "text/plain"]]}
    assert not red.has_secret(ordinary)
    assert red.value(ordinary) == ordinary
    assert locate(red, ordinary) == []


TEXT_PAIRS = [t.replace("VALUE", V) for t in (
    '{"name": "MY_API_KEY", "value": "VALUE"}',
    '- name: DB_PASSWORD\n  value: VALUE\n',  # a Kubernetes env entry as YAML
    'env: [{\\"name\\": \\"MY_API_KEY\\", \\"value\\": \\"VALUE\\"}]',  # JSON in a string
    "{'key': 'SERVICE_TOKEN', 'default': 'VALUE'}",
)]


@pytest.mark.parametrize("text", TEXT_PAIRS)
def test_a_name_and_value_pair_printed_as_text_is_redacted(red, text):
    out = red.text(text)
    assert V not in out and "[REDACTED:named-secret]" in out
    assert out.count("\n") == text.count("\n")
    log = SGLANG_LOG * 4 + text + "\n" + SGLANG_LOG
    assert V not in red.text(log)
    doc = orjson.dumps({"stdout": text})
    assert red.might_contain_secret_bytes(doc) and V.encode() not in red.json_bytes(doc)
    plain = text.replace("MY_API_KEY", "MY_PATH").replace("DB_PASSWORD", "DB_HOST") \
        .replace("SERVICE_TOKEN", "SERVICE_URL")
    assert red.text(plain) is plain


# --- across two output lines ------------------------------------------------------------------

TWO_LINES = [
    (f"Authorization:\n  Basic {B64}", [B64]),
    (f"Authorization:\n  Bearer {JWT}", [JWT[-20:]]),
    (f"password:\n  {V}", [V]),
    (f"MY_API_KEY: |\n  {V}\nnext: 1", [V]),
    (f"X-Api-Key:\n{V}", [V]),
    (f"export token=\n{GH}", [GH[4:]]),
    # Tokens wrapped at a fixed width, with and without indentation.
    (f"token:\n{wrap(HF, 20)}", pieces(HF, 20)),
    (f"key: {wrap(SK, 16, '  ')}", pieces(SK, 16)),
    (f"Authorization: Bearer {wrap(JWT, 24)}", pieces(JWT, 24)[1:]),
    (wrap(GH, 10), pieces(GH, 10)[1:]),
    (PEM, PEM_BODY),
    (f"key file:\n{wrap(PEM.replace(chr(10), ''), 64)}".replace("-----MIIE", "-----\nMIIE"),
     [p[:20] for p in PEM_BODY]),
]


@pytest.mark.parametrize(("text", "gone"), TWO_LINES)
def test_a_secret_split_across_lines_is_redacted(red, text, gone):
    out = red.text(text)
    for part in gone:
        assert part not in out, (part, out)
    assert out.count("\n") == text.count("\n")  # every line keeps its place
    for log in (SGLANG_LOG * 4 + text + "\n" + SGLANG_LOG, text + "\n" + SGLANG_LOG * 8):
        clean = red.text(log)
        assert clean.count("\n") == log.count("\n")
        for part in gone:
            assert part not in clean, part


ORDINARY_TWO_LINES = [
    "credentials:\n  user: alice\n  role: admin\n", "api_key:\nport: 30000",
    "TOKEN:\n  32768", "password:\n  - first\n", "secret:\n  # set by the operator\n",
    "sha256:9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b\nsha256:0a1b2c3d4e5f60718293a4b5c6d7e8f9\n",
    "Authorization:\n\nnext paragraph", "token usage:\n  0.05",
]


@pytest.mark.parametrize("text", ORDINARY_TWO_LINES)
def test_ordinary_two_line_texts_stay_intact(red, text):
    assert red.text(text) is text
    big = SGLANG_LOG * 4 + text + "\n" + SGLANG_LOG
    assert red.text(big) == big


def test_a_word_after_a_whole_token_is_not_taken_for_more_of_it(red):
    for word in ("done", "OK", "Finished", "DONE"):
        text = f"export TOKEN_FILE_CONTENT={HF}\n{word}\n"
        assert red.text(text) == f"export TOKEN_FILE_CONTENT=[REDACTED:HuggingFace Token]" \
                                 f"\n{word}\n"
    # The short last piece of a wrapped token ends its run: the word after it stays.
    text = wrap(HF, 12) + "\nfinished\n"
    out = red.text(text)
    assert out.endswith("]\nfinished\n") and not any(x in out for x in pieces(HF, 12))


def test_the_triggers_catch_every_next_line_assignment():
    """The screen stays a necessary condition with the value on the next line (the contract
    of secrets/patterns.py): whenever the rule redacts, every scan path finds it."""
    rng = random.Random(13)
    r = Redactor()
    names = ["MY_API_KEY", "password", "Authorization", "db_password", "GITHUB_TOKEN",
             "api_key", "client-secret", "AUTH", "X-Api-Key", "sort_key", "token"]
    values = [V, "12345", "Basic " + B64, "hunter2x", "- item", "# note", "user: x", "$REF"]
    checked = 0
    for _ in range(1500):
        text = (rng.choice(["", "  ", "export ", "[ts] "]) + rng.choice(names) + ":"
                + rng.choice(["", " ", " |", " >-", "\t"]) + rng.choice(["\n", "\r\n"])
                + rng.choice(["", "  ", "\t"]) + rng.choice(values))
        direct = redact_assignments(text)
        if direct is text:
            continue
        checked += 1
        assert r.might_contain_secret(text), text
        assert r.might_contain_secret_bytes(orjson.dumps(text)), text
        assert r.text(text) == direct, text
        log = SGLANG_LOG * 5 + text + "\n"
        assert r.text(log) == SGLANG_LOG * 5 + direct + "\n", text
    assert checked > 300


CHILD = r'''
import sys, time
tok = sys.argv[1]
sys.stdout.write("token: " + tok[:11]); sys.stdout.flush()      # two writes, one line
sys.stdout.write(tok[11:] + "\n"); sys.stdout.flush()
print("Authorization:", flush=True)                             # a header and its value
print("  Basic " + sys.argv[2], flush=True)
for i in range(0, len(tok), 12):                                  # wrapped at 12 columns
    print(tok[i:i + 12], flush=True)
print("done")
'''


def test_a_child_writing_a_token_in_pieces_is_redacted(workspace, tmp_path):
    from infer_forge.harness.tool_calls.calls import run_tool

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run = run_tool(workspace, [sys.executable, str(script), HF, B64], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    stored = workspace.artifacts.text(run.event.stdout_digest)
    for out in (run.stdout, stored):
        assert "done" in out and "token: [REDACTED" in out
        for part in [HF[3:11], HF[11:], B64, *pieces(HF, 12)[1:]]:
            assert part not in out, part
    # The token was in its argv too: redacted in the event.
    assert HF not in json.dumps(run.event.argv)


# --- across the chunks of a streamed artifact ---------------------------------------------

STREAM_TEXT = (
    "starting\n" + SGLANG_LOG.splitlines()[0] + "\n" + f"HF_TOKEN={HF}\n"
    + "Authorization:\n  Basic " + B64 + "\n" + "x = 1\n" * 5 + PEM + "\nafter the key\n"
    + f"token:\n{wrap(GH, 9)}\n" + '{"name": "MY_API_KEY", "value": "' + V + '"}\n'
    + f"Bearer {JWT}\n" + "the end"
)
STREAM_SECRETS = [HF[3:], B64, *PEM_BODY, *pieces(GH, 9)[1:], V, JWT[-30:]]


def test_a_token_cut_by_a_chunk_boundary_is_redacted_as_put_redacts_it(workspace):
    store = workspace.artifacts
    data = STREAM_TEXT.encode()
    whole = store.put(data)
    clean = store.get(whole)
    for part in STREAM_SECRETS:
        assert part.encode() not in clean, part
    rng = random.Random(5)
    cuts = sorted(set(rng.sample(range(1, len(data)), 60)) | {data.index(b"hf_") + 5,
                                                               data.index(b"MIIE") + 3})
    for cut in cuts:  # one boundary anywhere, inside a token or between a header and value
        assert store.put_stream([data[:cut], data[cut:]]) == whole, cut
    for seed in range(20):  # many boundaries, and one byte at a time
        r = random.Random(seed)
        marks = sorted(r.sample(range(1, len(data)), r.randint(2, 50)))
        chunks = [data[a:b] for a, b in zip([0, *marks], [*marks, len(data)], strict=True)]
        assert store.put_stream(chunks) == whole, seed
    assert store.put_stream([data[i:i + 1] for i in range(len(data))]) == whole


def test_the_stream_redactor_keeps_binary_and_bounds_what_it_holds(red):
    s = StreamRedactor(red)
    binary = bytes(range(256)) * 4
    assert s.feed(binary) + s.finish() == binary
    s = StreamRedactor(red)
    out = s.feed(b"line one\nline two\n")
    assert out == b""  # held: the next lines may hold a value for these
    out += s.feed(b"3\n4\n5\n6\n")
    assert out.startswith(b"line one\n")
    assert out + s.finish() == b"line one\nline two\n3\n4\n5\n6\n"
    s = StreamRedactor(red)
    long = b"x " * (1 << 20)  # one line over MAX_HOLD: released at a delimiter
    first = s.feed(long)
    assert 0 < len(first) <= len(long) and first + s.finish() == long


# --- in YAML specs: refused at definition ---------------------------------------------------


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_a_secret_in_a_task_yaml_is_refused_with_the_field_named(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    task = make_task_dir(tmp_path / "specs")
    text = task.read_text().replace("evalscript.py]", f"evalscript.py, --api-key, {SK}]")
    text = text.replace("goal: Raise", f"goal: with {GH} raise").replace(
        "exit:", f"context: {{notes: 'export MY_SERVICE_PASSWORD={V}'}}\nexit:")
    task.write_text(text)
    with open_workspace(forge_home) as ws:
        before = ws.ledger.max_position()
    r = run_forge("task", "new", str(task))
    assert r.returncode == 1, r.stdout
    lines = r.stderr.splitlines()
    advice = "looks like a secret ({}); reference it by environment variable name instead"
    assert f"error: {task}:{_line_of(task, 'goal:')}: goal: " + advice.format("GitHub Token") \
        in lines
    assert (f"error: {task}:{_line_of(task, 'evaluator:')}: evaluator.argv[3]: "
            + advice.format("API Key")) in lines
    assert (f"error: {task}:{_line_of(task, 'context:')}: context.notes: "
            + advice.format("named-secret")) in lines
    for secret in (SK, GH, V):
        assert secret not in r.stdout + r.stderr
    with open_workspace(forge_home) as ws:
        assert ws.ledger.max_position() == before


PROFILE = """\
service: tiny-cpu
rev: 1
engine: hf
config:
  dtype: float32
{extra}
framework: {{kind: transformers, version: "5"}}
"""


@pytest.mark.parametrize(("extra", "field", "kind"), [
    (f"  api_key: {SK}", "config.api_key", "API Key"),
    (f"  hf_token: {HF}", "config.hf_token", "HuggingFace Token"),
    (f"  db_password: {V}", "config.db_password", "named-secret"),
    (f"  {GH[:14]}: {GH[14:]}", "config.[REDACTED]", "GitHub Token"),
    (f"  env: [{{name: MY_API_KEY, value: {V}}}]", "config.env[0].value", "named-secret"),
    (f"  launch: [--api-key, {V}]", "config.launch[1]", "named-secret"),
    ("  private_key: |\n" + "\n".join("    " + x for x in PEM.splitlines()),
     "config.private_key", "Private Key Block"),
])
def test_a_secret_in_a_profile_is_refused_by_profile_record(forge_home, tmp_path, extra,
                                                             field, kind):
    assert run_forge("init").returncode == 0
    f = tmp_path / "profile.yaml"
    f.write_text(PROFILE.format(extra=extra))
    with open_workspace(forge_home) as ws:
        before = ws.ledger.max_position()
    r = run_forge("profile", "record", str(f))
    assert r.returncode == 1
    line = _line_of(f, extra.split(":")[0].strip().split("\n")[0])
    assert r.stderr.strip() == (f"Error: {f}:{line}: {field}: looks like a secret ({kind}); "
                                "reference it by environment variable name instead"), r.stderr
    for secret in (SK, HF, V, GH[4:14], GH[14:], PEM_BODY[0]):
        assert secret not in r.stdout + r.stderr
    with open_workspace(forge_home) as ws:
        assert ws.ledger.max_position() == before


def test_references_to_secrets_are_not_secrets(forge_home, tmp_path):
    """What a spec should write instead: the variable's name, a reference, a placeholder."""
    assert run_forge("init").returncode == 0
    f = tmp_path / "profile.yaml"
    f.write_text(PROFILE.format(extra="\n".join([
        "  api_key: OPENAI_API_KEY", "  hf_token: ${HF_TOKEN}", "  github_token: $GITHUB_TOKEN",
        "  api_key_env: OPENAI_API_KEY", "  password_file: /run/secrets/db", "  auth_token: null",
        "  max_new_tokens: 128", "  secret_env: [HF_TOKEN, WANDB_API_KEY]",
        "  launch: [--api-key, OPENAI_API_KEY, --port, '30000']"])))
    r = run_forge("profile", "record", str(f))
    assert r.returncode == 0, r.stderr
    # The example specs all load (nothing in them is mistaken for a secret).
    for spec in sorted((REPO / "examples").glob("*/*.yaml")):
        if spec.parent.name in ("points", "profiles", "tasks"):
            assert run_forge("point", "validate", str(spec)).returncode == 0, spec
