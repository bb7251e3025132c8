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
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

# detect-secrets plugins we do not use: they flag ordinary log lines, not credentials.
_SKIPPED_PLUGINS = {
    "Base64HighEntropyString",
    "HexHighEntropyString",
    "KeywordDetector",
    "IPPublicDetector",
}

# Patterns detect-secrets does not have. The optional group 1 is what gets replaced.
_EXTRA_RULES: list[tuple[str, str, int]] = [
    ("HuggingFace Token", r"\bhf_[A-Za-z0-9]{30,}", 0),
    # detect-secrets' JWT pattern stops before the signature; take all three segments.
    ("JSON Web Token", r"\beyJ[A-Za-z0-9_\-]+\.eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-+/=]*", 0),
    ("NPM Token", r"\bnpm_[A-Za-z0-9]{36}\b", 0),
    ("GitHub Token", r"\bgithub_pat_[A-Za-z0-9_]{22,}", 0),
    ("Google API Key", r"\bAIza[0-9A-Za-z_\-]{35}", 0),
    # The AWS secret key has no shape of its own; its usual assignment does.
    ("AWS Secret Key",
     r"(?i:aws_?secret_?(?:access_?)?key)[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
     1),
    ("API Key", r"\bsk-(?:proj-|ant-(?:api\d\d-)?|svcacct-)?[A-Za-z0-9_\-]{20,}", 0),
    (
        "Private Key Block",
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END[A-Z0-9 ]*PRIVATE KEY"
        r"(?: BLOCK)?-----|$)",
        0,
    ),
    ("Private Key Block", r"PuTTY-User-Key-File-\d+:.*?(?:Private-MAC:[^\n]*|$)", 0),
    ("Bearer Token", r"(?i:\bbearer)\s+([A-Za-z0-9_\-.=+/]{16,})", 1),
    ("Basic Auth Credentials", r"://[^:/?#\[\]@!$&'()*+,;=\s\"]+:([^/?#\[\]@\s\"]+)@", 1),
]

# Triggers: cheap necessary conditions. Every match of every rule contains a match of one of
# these (tests/test_redact.py checks each rule's sample through every scan path), so text
# without a trigger hit holds no secret. Each is (regex, anchors): every match of the regex
# contains one of the literal anchors, so a substring test rules most text out before any
# regex runs. Both also hold on the JSON serialization of a string (hence `\\?` before
# quotes), which lets a whole event be screened in one pass over its JSON bytes.
_TRIGGER_SPECS: list[tuple[str, tuple[str, ...]]] = [
    # Artifactory AKC…/AP…, AWS key ids, Azure storage, Google, Twilio AC…
    (r"A(?:KC|P[\dA-F]|3T|BIA|CCA|KIA|SIA|ccountKey=|Iza|C[a-z0-9]{32})", ("A",)),
    (r"://[^/\s\"@]+@", ("://",)),  # credentials in a URL (basic auth, Cloudant)
    (r"g(?:h[pousr]_|ithub_pat_|l(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas)-)",
     ("gh", "gl", "github_pat_")),  # GitHub, GitLab
    ("GR1348941", ()),  # GitLab runner
    ("eyJ", ()),  # JWT
    ("_authToken", ()), ("npm_", ()),  # npm
    (r"s(?:k-|q0csp-)", ("sk-", "sq0csp-")),  # OpenAI/Anthropic/other API keys, Square
    ("k_live_", ()),  # Stripe
    ("BEGIN", ()), ("PuTTY-User-Key", ()),  # private keys
    ("pypi-AgE", ()),  # PyPI
    (r"S(?:G\.[\w-]{22}\.|K[a-z0-9]{32})", ("SG.", "SK")),  # SendGrid, Twilio SK…
    (r"\.[\w-]{6}\.[\w-]{27}", (".",)),  # Discord
    (r"-us\d", ("-us",)),  # Mailchimp
    (r":(?<=\d{8}:)[\w-]{35}", (":",)),  # Telegram (not the digits of `sha256:<hex>`)
    ("hf_", ()),  # Hugging Face
]
# Matched against the lowercased text (much faster than (?i)): the case-insensitive rules.
_LOWER_TRIGGER_SPECS: list[tuple[str, tuple[str, ...]]] = [
    ("aws", ()),
    ("xox", ()), (r"hooks\.slack", ("hooks.slack",)),  # Slack
    ("softlayer", ()),
    ("bearer", ()),
    # Cloudant, IBM Cloud IAM, IBM COS, SoftLayer: a key-ish word, a separator, a long value.
    *(
        (kw + r"\\?[\"']?\]? *[:=>]* *\\?[\"']?[a-z0-9_\-]{24}", anchors)
        for kw, anchors in (("key", ("key",)), (r"p(?:wd?|ass(?:word)?)", ("pw", "pass")),
                            ("token", ("token",)))
    ),
]
_TRIGGERS = [t for t, _ in _TRIGGER_SPECS]
_LOWER_TRIGGERS = [t for t, _ in _LOWER_TRIGGER_SPECS]


@dataclass(frozen=True)
class _Screen:
    """One trigger for the screening pass: literal anchors, then the regex (None: the anchor
    is the whole trigger)."""

    anchors: tuple[bytes, ...]
    pattern: re.Pattern[bytes] | None

    def hit(self, data: bytes) -> bool:
        for a in self.anchors:
            if a in data:
                return self.pattern is None or self.pattern.search(data) is not None
        return False


def _screens(specs: list[tuple[str, tuple[str, ...]]]) -> list[_Screen]:
    out = []
    for regex, anchors in specs:
        if anchors:
            out.append(_Screen(tuple(a.encode() for a in anchors),
                               re.compile(_as_bytes_trigger(regex))))
        else:  # a plain literal
            out.append(_Screen((regex.encode(),), None))
    return out

REDACTED = "[REDACTED]"


@dataclass(frozen=True)
class _Rule:
    label: str
    pattern: re.Pattern[str]
    group: int  # 0: replace the whole match, n: replace group n only


@lru_cache(maxsize=1)
def _plugin_rules() -> tuple[_Rule, ...]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    rules: list[_Rule] = []
    for label, regex, group in _EXTRA_RULES:
        rules.append(_Rule(label, re.compile(regex, re.DOTALL), group))
    for label, cls in get_mapping_from_secret_type_to_class().items():
        if cls.__name__ in _SKIPPED_PLUGINS:
            continue
        for pattern in getattr(cls(), "denylist", ()):
            group = 1 if pattern.groups >= 1 and cls.__name__ not in {
                "GitHubTokenDetector",
                "GitLabTokenDetector",
                "NpmDetector",
            } else 0
            rules.append(_Rule(label, _without_borders(pattern), group))
    return tuple(rules)


def _without_borders(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """Artifactory's patterns consume the whitespace around the token; as lookarounds the
    replacement keeps it (and the line structure of a log)."""
    p = pattern.pattern
    if p.startswith(r'(?:\s|=|:|"|^)') and p.endswith(r'(?:\s|"|$)'):
        p = r'(?:(?<=[\s=:"])|^)' + p[len(r'(?:\s|=|:|"|^)'):-len(r'(?:\s|"|$)')]
        return re.compile(p + r'(?=[\s"]|$)', pattern.flags)
    return pattern


class Redactor:
    """Replaces secrets in text and JSON-like values with `[REDACTED:<kind>]`.

    Contract: `text(s)` returns `s` unchanged (the same object) when it holds no secret;
    `value(v)` walks dicts/lists/tuples and redacts every string; `json_bytes(b)` redacts a
    serialized JSON object, re-serializing only when something was found.
    """

    def __init__(self, secret_values: Iterable[str] = ()):
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
        self._trigger = re.compile("|".join(f"(?:{t})" for t in _TRIGGERS + value_alts))
        self._trigger_low = re.compile("|".join(f"(?:{t})" for t in _LOWER_TRIGGERS))
        # JSON documents: anchors first, regexes only past an anchor.
        self._screens = _screens(_TRIGGER_SPECS)
        self._screens_low = _screens(_LOWER_TRIGGER_SPECS)
        value_forms = {v.encode("utf-8", "surrogatepass") for v in values}
        value_forms |= {orjson.dumps(v)[1:-1] for v in values}  # as they appear inside JSON
        self._screens += [_Screen((f,), None) for f in sorted(value_forms)]
        # Long text (logs): one pass per trigger over the UTF-8 bytes, each a fast
        # literal-led scan; bytes.lower() is cheap and never changes offsets.
        value_bytes = [re.escape(v).encode("utf-8", "surrogatepass") for v in values]
        self._region_triggers = [re.compile(_as_bytes_trigger(t)) for t in _TRIGGERS]
        self._region_triggers += [re.compile(v) for v in value_bytes]
        self._region_triggers_low = [re.compile(_as_bytes_trigger(t)) for t in _LOWER_TRIGGERS]
        # The rules (and detect-secrets, slow to import) load on the first trigger hit:
        # commands that only read the ledger never pay for them.
        # Event payloads repeat the same strings (task ids, metric names, enum values).
        self._clean: dict[str, None] = {}

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
        for screen in self._screens:
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
        out = text
        if self._value_re is not None:
            out = self._value_re.sub(f"{REDACTED[:-1]}:configured-secret]", out)
        for rule in _plugin_rules():
            if rule.pattern.search(out) is None:
                continue
            out = _replace(out, rule)
        return out

    # --- structured values ------------------------------------------------------------------

    def _clean_str(self, text: str) -> bool:
        if text in self._clean:
            return True
        return self._leaf(text) is text

    def has_secret(self, value: Any) -> bool:
        """Whether any string inside `value` (dict keys included) holds a secret: the cheap
        check before `value()`, which rebuilds the structure. Allocates nothing when clean."""
        t = type(value)
        if t is str:
            return not self._clean_str(value)
        clean = self._clean
        if t is dict:
            for k, v in value.items():
                if type(k) is str:
                    if k not in clean and not self._clean_str(k):
                        return True
                elif self.has_secret(k):
                    return True
                tv = type(v)
                if tv is str:
                    if v not in clean and not self._clean_str(v):
                        return True
                elif tv is dict or tv is list or tv is tuple or isinstance(v, str | dict | list):
                    if self.has_secret(v):
                        return True
            return False
        if t is list or t is tuple:
            return any(self.has_secret(v) for v in value)
        if isinstance(value, str):
            return not self._clean_str(str(value))
        if isinstance(value, dict | list | tuple):
            return self.has_secret(dict(value) if isinstance(value, dict) else list(value))
        return False

    def value(self, value: Any) -> Any:
        """Redact every string inside `value`; other leaves (numbers, UUIDs, datetimes) pass."""
        if isinstance(value, str):
            return self._leaf(value)
        if isinstance(value, dict):
            return {
                self._leaf(k) if isinstance(k, str) else k: self.value(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self.value(v) for v in value)
        return value

    def json_bytes(self, data: bytes) -> bytes:
        """Redact a JSON document given as bytes; the fast path returns `data` itself."""
        if not self.might_contain_secret_bytes(data):
            return data
        return orjson.dumps(self.value(orjson.loads(data)))


# Texts longer than this are scanned region by region (see `Redactor._text_by_regions`).
_REGION_SCAN_MIN = 8192


def _line_start(data: bytes, pos: int) -> int:
    return 0 if pos <= 0 else data.rfind(b"\n", 0, pos) + 1


def _line_end(data: bytes, pos: int) -> int:
    if pos >= len(data):
        return len(data)
    end = data.find(b"\n", pos)
    return len(data) if end < 0 else end


def _as_bytes_trigger(pattern: str) -> bytes:
    """A str trigger for the byte scan. The rules' \\w and \\d are Unicode-aware, so the
    byte version also accepts any non-ASCII byte where they stand: still a necessary
    condition."""
    for old, new in (
        (r"[\w-]", r"[\w\x80-\xff-]"),
        (r"(?<=\d{8}:)", r"(?<=[\d\x80-\xff]{8}:)"),
        (r"[\dA-F]", r"[\dA-F\x80-\xff]"),
    ):
        pattern = pattern.replace(old, new)
    return pattern.encode("ascii")


def _replace(text: str, rule: _Rule) -> str:
    tag = f"[REDACTED:{rule.label}]"

    def sub(m: re.Match[str]) -> str:
        if rule.group and m.lastindex and m.group(rule.group) is not None:
            start, end = m.span(rule.group)
            s0 = m.start()
            whole = m.group(0)
            return whole[: start - s0] + tag + whole[end - s0 :]
        return tag

    return rule.pattern.sub(sub, text)


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
    """Collect the exact secret values named by configuration (env var names, files)."""
    values = [os.environ[n] for n in env_names if os.environ.get(n)]
    for f in files:
        p = Path(f).expanduser()
        if p.is_file():
            content = p.read_text(encoding="utf-8", errors="replace").strip()
            values.append(content)
            values.extend(line.strip() for line in content.splitlines() if line.strip())
    return values
