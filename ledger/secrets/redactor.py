"""Secrets never reach the ledger: redaction of event payloads and artifacts.

Three sources of truth for what a secret is:
1. exact values of the secrets the configuration names (environment variables, files);
2. the regexes of `detect-secrets`' provider plugins (AWS, GitHub, GitLab, OpenAI, Slack,
   private keys, JWTs, basic-auth URLs, …) — not its entropy, keyword or public-IP plugins,
   which flag ordinary server-log lines;
3. patterns for tokens detect-secrets lacks (Hugging Face `hf_…`, current OpenAI/Anthropic
   keys, whole PEM private-key blocks, bearer tokens).

Speed matters because every event and log passes through here: cheap *triggers*, each a
necessary condition of some rule, screen the text first; only text that trips a trigger is
scanned with every rule (the slow, exact path) — for a long log, only the lines around a hit.

Secrets split in two are found too: a token wrapped over lines or cut between a mapping's
key and its value (`splits`), a name and its value under two keys or on two lines
(`names`), a token cut by a chunk boundary of a stream (`stream`). Every
replacement keeps the text's line breaks. `locate.locate(red, value)` says where a value holds
a secret (the spec check, `forge secrets scan`) without repeating it.

Here: the `Redactor` (text, structured values, JSON bytes) and the configured secret values.
The secret-name rule lives in `names`, the provider patterns and triggers in `patterns`;
the structured walk's name helpers (`named_secret`, `pointed_strength`, `flag_values`) are
here, shared with `locate`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from .names import (
    NAMED_SECRET_TAG,
    NOT_SECRET,
    REDACTED,
    env_secret_values,
    is_secret_value,
    name_strength,
    pair_strength,
    redact_assignments,
    redact_pointer_pairs,
)
from .patterns import (
    LOWER_TRIGGER_SPECS,
    LOWER_TRIGGERS,
    TRIGGER_SPECS,
    TRIGGERS,
    Screen,
    as_bytes_trigger,
    plugin_rules,
    redact_matches,
    screens,
    tag_lines,
)
from .splits import CONTINUATION, MAX_WRAP_LINES, redact_wrapped, split_kind


class Redactor:
    """Replaces secrets in text and JSON-like values with `[REDACTED:<kind>]`.

    Contract: `text(s)` returns `s` unchanged (the same object) when it holds no secret;
    `value(v)` walks dicts/lists/tuples and redacts every string; `json_bytes(b)` redacts a
    serialized JSON object, re-serializing only when something was found.
    """

    def __init__(self, secret_values: Iterable[str] = (), *, assignments: bool = True):
        # `assignments`: apply the `NAME=value` rule to text (off for error messages, whose
        # `field.api_key: expected a string` is no assignment).
        self._assignments = assignments
        # Very short values would redact ordinary words; configuration secrets are long.
        values = sorted({v for v in secret_values if v and len(v) >= 6}, key=len, reverse=True)
        self._values = values
        value_alts = []
        for v in values:
            value_alts.append(re.escape(v))
            escaped = orjson.dumps(v).decode()[1:-1]
            if escaped != v:
                value_alts.append(re.escape(escaped))
        self._value_re = re.compile("|".join(value_alts)) if value_alts else None
        # Short strings: one combined regex, one call.
        self._trigger = re.compile("|".join(f"(?:{t})" for t in TRIGGERS + value_alts))
        self._trigger_low = re.compile("|".join(f"(?:{t})" for t in LOWER_TRIGGERS))
        # JSON documents: anchors first, regexes only past an anchor.
        self.screens = screens(TRIGGER_SPECS)
        self._screens_low = screens(LOWER_TRIGGER_SPECS)
        value_forms = {v.encode("utf-8", "surrogatepass") for v in values}
        value_forms |= {orjson.dumps(v)[1:-1] for v in values}  # as they appear inside JSON
        self.screens += [Screen((f,), None) for f in sorted(value_forms)]
        # Long text (logs): one pass per trigger over the UTF-8 bytes, each a fast
        # literal-led scan; bytes.lower() is cheap and never changes offsets.
        value_bytes = [re.escape(v).encode("utf-8", "surrogatepass") for v in values]
        self._region_triggers = [re.compile(as_bytes_trigger(t)) for t in TRIGGERS]
        self._region_triggers += [re.compile(v) for v in value_bytes]
        self._region_triggers_low = [re.compile(as_bytes_trigger(t)) for t in LOWER_TRIGGERS]
        # The rules (and detect-secrets, slow to import) load on the first trigger hit:
        # commands that only read the ledger never pay for them.
        # Event payloads repeat the same strings (task ids, metric names, enum values).
        self._clean: dict[str, None] = {}
        self._plain_keys: dict[str, None] = {}  # mapping keys that need no name check
        self._heads: dict[str, bool] = {}  # key -> may it hold the head of a split token

    # --- text -----------------------------------------------------------------------------

    def might_contain_secret(self, text: str) -> bool:
        """The screen for a short string: False means no rule can match it."""
        return (
            self._trigger.search(text) is not None
            or self._trigger_low.search(text.lower()) is not None
        )

    def might_contain_secret_bytes(self, data: bytes) -> bool:
        """The screen: False means no rule can match `data` (UTF-8 text, or a JSON document
        whose strings are to be redacted)."""
        for screen in self.screens:
            if screen.hit(data):
                return True
        low = data.lower()
        for screen in self._screens_low:
            if screen.hit(low):
                return True
        return False

    def text(self, text: str) -> str:
        if not text:
            return text
        if len(text) > _REGION_SCAN_MIN:
            return self._text_by_regions(text)
        if not self.might_contain_secret(text):
            return text
        return self._scrub(text)

    def _text_by_regions(self, text: str) -> str:
        """Long text (a server log): scrub only the lines around trigger hits.

        Every rule's match contains a trigger match, and no rule spans more than a line or
        two except private-key blocks, so scrubbing the hit's line and its neighbours (a key
        block: through its END line) finds what scrubbing the whole text finds, at the cost
        of the trigger scan instead of every rule over every line. The scan runs on UTF-8
        bytes: region boundaries are newlines, which never split a character."""
        data = text.encode("utf-8", "surrogatepass")
        low = data.lower()
        hits = [m.span() for t in self._region_triggers for m in t.finditer(data)]
        hits += [m.span() for t in self._region_triggers_low for m in t.finditer(low)]
        if not hits:
            return text
        size = len(data)
        regions: list[list[int]] = []
        for a, b in sorted(hits):
            start = _line_start(data, _line_start(data, a) - 1)
            end = _line_end(data, _line_end(data, b) + 1)
            if data.startswith((b"BEGIN", b"PuTTY-User-Key"), a):
                stop = data.find(b"-----END", b)
                end = size if stop < 0 else _line_end(data, stop)
            for _ in range(MAX_WRAP_LINES):  # a token wrapped over the lines that follow
                more = CONTINUATION.match(data, end)
                if more is None:
                    break
                end = more.end()
            if regions and start <= regions[-1][1]:
                regions[-1][1] = max(regions[-1][1], end)
            else:
                regions.append([start, end])
        out: list[bytes] = []
        last = 0
        changed = False
        for start, end in regions:
            region = data[start:end].decode("utf-8", "surrogatepass")
            clean = self._scrub(region)
            out.append(data[last:start])
            if clean != region:
                changed = True
                out.append(clean.encode("utf-8", "surrogatepass"))
            else:
                out.append(data[start:end])
            last = end
        if not changed:
            return text
        out.append(data[last:])
        return b"".join(out).decode("utf-8", "surrogatepass")

    def _leaf(self, text: str) -> str:
        if text in self._clean:
            return text
        out = self.text(text)
        if out is text and len(text) < 512:
            if len(self._clean) > 65536:
                self._clean.clear()
            self._clean[text] = None
        return out

    def _scrub(self, text: str) -> str:
        # Every replacement keeps the text's line breaks (`tag_lines`): the streaming
        # redactor (`stream`) maps its output back to its input line by line.
        out = redact_wrapped(text, plugin_rules())  # before a line's part is redacted alone
        if self._value_re is not None:
            tag = f"{REDACTED[:-1]}:configured-secret]"
            out = self._value_re.sub(lambda m: tag_lines(m.group(0), tag), out)
        for rule in plugin_rules():
            if rule.pattern.search(out) is None:
                continue
            out = redact_matches(out, rule)
        if self._assignments:
            out = redact_pointer_pairs(redact_assignments(out))
        return out

    def secret_kinds(self, text: str) -> list[str]:
        """The kinds of secret found in `text` (`GitHub Token`, `named-secret`, …), for an
        error that refuses the text without repeating it; empty when it holds none."""
        out = self._leaf(text)
        if out is text:
            return []
        return sorted(set(re.findall(r"\[REDACTED:([^\]]+)\]", out))) or ["secret"]

    def with_values(self, values: Iterable[str]) -> Redactor:
        """This redactor plus more exact values (itself when they add nothing)."""
        extra = {v for v in values if v and len(v) >= 6} - set(self._values)
        if not extra:
            return self
        return Redactor([*self._values, *extra], assignments=self._assignments)

    def for_env(self, env: Mapping[str, str], names: Iterable[str] = ()) -> Redactor:
        """For output captured from a child process with environment `env`: this redactor
        plus the values of the child's secret-named variables (`env_secret_values`)."""
        return self.with_values(env_secret_values(env, names))

    # --- structured values ------------------------------------------------------------------
    # Besides every string, a mapping's values are redacted by the name they stand under
    # (`{"MY_API_KEY": "…"}`), by a name beside them (`{"name": "MY_API_KEY", "value": "…"}`,
    # a diff entry `{"path": "config.env.MY_API_KEY", "a": "…", "b": "…"}`), and a list's
    # item by the flag before it (`["--api-key", "…"]`).

    def _clean_str(self, text: str) -> bool:
        if text in self._clean:
            return True
        return self._leaf(text) is text

    def has_secret(self, value: Any) -> bool:
        """Whether any string inside `value` (dict keys included) holds a secret, or any value
        stands under a secret name: the cheap check before `value()`, which rebuilds the
        structure. Allocates nothing when clean."""
        t = type(value)
        if t is str:
            return not self._clean_str(value)
        clean = self._clean
        if t is dict:
            plain = self._plain_keys
            pointer = False
            for k, v in value.items():
                if k in plain:  # a key seen before: no secret, no secret name, no pointer
                    pass
                elif type(k) is str:
                    if not self._clean_str(k):
                        return True
                    strength = name_strength(k)
                    if strength:
                        if named_secret(strength, v):
                            return True
                    elif k in _POINTER_KEYS:
                        pointer = True
                    elif self.is_head(k):  # never a plain key: its value is checked with it
                        if type(v) is str and split_kind(k, v, plugin_rules()):
                            return True
                    elif len(k) < 512:
                        if len(plain) > 65536:
                            plain.clear()
                        plain[k] = None
                elif self.has_secret(k):
                    return True
                tv = type(v)
                if tv is str:
                    if v not in clean and not self._clean_str(v):
                        return True
                elif tv is dict or tv is list or tv is tuple or isinstance(v, str | dict | list):
                    if self.has_secret(v):
                        return True
            if pointer:
                strength = pointed_strength(value)
                if strength and any(named_secret(strength, value[k]) for k in POINTED_VALUES
                                    if k in value):
                    return True
            return False
        if t is list or t is tuple:
            pair = pair_strength(value)  # `["MY_API_KEY", "…"]`
            if pair and is_secret_value(pair, value[1]):
                return True
            flag = NOT_SECRET  # the strength of a `--secret-flag` just before
            for v in value:
                tv = type(v)
                if tv is str:
                    if v not in clean and not self._clean_str(v):
                        return True
                    if flag and not v.startswith("-") and is_secret_value(flag, v):
                        return True
                    flag = _flag_strength(v) if v.startswith("-") else NOT_SECRET
                    continue
                flag = NOT_SECRET
                if tv is dict or tv is list or tv is tuple or isinstance(v, str | dict | list):
                    if self.has_secret(v):
                        return True
            return False
        if isinstance(value, str):
            return not self._clean_str(str(value))
        if isinstance(value, dict | list | tuple):
            return self.has_secret(dict(value) if isinstance(value, dict) else list(value))
        return False

    def value(self, value: Any) -> Any:
        """Redact every string inside `value` and every value under a secret name; other
        leaves (numbers, UUIDs, datetimes) pass."""
        if isinstance(value, str):
            return self._leaf(value)
        if isinstance(value, dict):
            pointed = pointed_strength(value)
            out = {}
            for k, v in value.items():
                strength = name_strength(k) if isinstance(k, str) else NOT_SECRET
                if not strength and pointed and k in POINTED_VALUES:
                    strength = pointed
                split = (split_kind(k, v, plugin_rules()) if isinstance(k, str)
                         and isinstance(v, str) and self.is_head(k) else None)
                if split:  # the key holds the token's head, the value the rest: both go
                    tag = f"[REDACTED:{split}]"
                    key = tag
                    n = 1
                    while key in out or key in value:
                        n += 1
                        key = f"{tag} #{n}"
                    out[key] = tag
                    continue
                key = self._leaf(k) if isinstance(k, str) else k
                out[key] = self._named_value(strength, v) if strength else self.value(v)
            return out
        if isinstance(value, list | tuple):
            flagged = flag_values(value)
            return type(value)(NAMED_SECRET_TAG if i in flagged else self.value(v)
                               for i, v in enumerate(value))
        return value

    def is_head(self, key: str) -> bool:
        """Whether `key` trips a trigger (the cheap screen): only then can it hold the head
        of a token whose rest is its value (`splits.split_kind`)."""
        head = self._heads.get(key)
        if head is None:
            head = self.might_contain_secret(key)
            if len(self._heads) > 65536:
                self._heads.clear()
            self._heads[key] = head
        return head

    def _named_value(self, strength: int, v: Any) -> Any:
        if is_secret_value(strength, v):
            return NAMED_SECRET_TAG
        if isinstance(v, list | tuple):
            return type(v)(NAMED_SECRET_TAG if is_secret_value(strength, x) else self.value(x)
                           for x in v)
        return self.value(v)

    def json_bytes(self, data: bytes) -> bytes:
        """Redact a JSON document given as bytes; the fast path returns `data` itself."""
        if not self.might_contain_secret_bytes(data) and not _NAME_STEMS.search(data.lower()):
            return data
        doc = orjson.loads(data)
        return orjson.dumps(self.value(doc)) if self.has_secret(doc) else data


# Keys that name another value in the same mapping, and the keys of the values they name.
_POINTER_KEYS = frozenset({"name", "key", "path", "var", "variable", "env", "field"})
POINTED_VALUES = ("value", "a", "b", "old", "new", "before", "after", "from", "to", "default",
                   "current", "previous")
# Every secret name holds one of these (lowercased): the screen of `json_bytes`.
_NAME_STEMS = re.compile(rb"key|token|auth|pat|pwd|secret|pass|cred")


def named_secret(strength: int, v: Any) -> bool:
    """Whether `v`, under a name of this strength, is (or, a list, holds) a secret value."""
    if is_secret_value(strength, v):
        return True
    tv = type(v)
    if tv is list or tv is tuple:
        return any(is_secret_value(strength, x) for x in v)
    return False


def pointed_strength(d: dict[Any, Any]) -> int:
    for k in _POINTER_KEYS:
        v = d.get(k)
        if type(v) is str and len(v) <= 200:
            strength = name_strength(v)
            if strength:
                return strength
    return NOT_SECRET


def _flag_strength(item: str) -> int:
    """For a list item `--api-key` (a flag whose value is the next item): its name's strength."""
    if "=" in item or len(item) > 200:
        return NOT_SECRET
    return name_strength(item)


def flag_values(items: list[Any] | tuple[Any, ...]) -> set[int]:
    """Indexes of the items that follow a secret-named flag (`--api-key`, `-token`), and the
    value of a `[NAME, value]` pair under a secret name."""
    out: set[int] = set()
    pair = pair_strength(items)
    if pair and is_secret_value(pair, items[1]):
        out.add(1)
    for i in range(len(items) - 1):
        flag, nxt = items[i], items[i + 1]
        if (type(flag) is str and flag.startswith("-") and type(nxt) is str
                and not nxt.startswith("-")):
            strength = _flag_strength(flag)
            if strength and is_secret_value(strength, nxt):
                out.add(i + 1)
    return out


# Texts longer than this are scanned region by region (see `Redactor._text_by_regions`).
_REGION_SCAN_MIN = 8192


def _line_start(data: bytes, pos: int) -> int:
    return 0 if pos <= 0 else data.rfind(b"\n", 0, pos) + 1


def _line_end(data: bytes, pos: int) -> int:
    if pos >= len(data):
        return len(data)
    end = data.find(b"\n", pos)
    return len(data) if end < 0 else end


DEFAULT_SECRET_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "WANDB_API_KEY",
    "PGPASSWORD",
    "POSTGRES_PASSWORD",
)


def secret_values_from(env_names: Iterable[str], files: Iterable[str | Path]) -> list[str]:
    """Collect the exact secret values named by configuration (env var names, files), and the
    values of this process's variables whose names look secret (`env_secret_values`): a
    child process inherits them and may print them (`forge run -- env`)."""
    values = [os.environ[n] for n in env_names if os.environ.get(n)]
    values += env_secret_values(os.environ)
    for f in files:
        p = Path(f).expanduser()
        if p.is_file():
            content = p.read_text(encoding="utf-8", errors="replace").strip()
            values.append(content)
            values.extend(line.strip() for line in content.splitlines() if line.strip())
    return values


_MESSAGE_REDACTOR: list[Redactor] = []


def redact_message(message: str) -> str:
    """An error message with the secrets it may quote redacted (provider patterns, the values
    of the default and the secret-named environment variables)."""
    if not _MESSAGE_REDACTOR:
        _MESSAGE_REDACTOR.append(Redactor(secret_values_from(DEFAULT_SECRET_ENV, ()),
                                          assignments=False))
    return _MESSAGE_REDACTOR[0].text(message)
