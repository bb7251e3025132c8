"""Secrets never reach the ledger: redaction of event payloads and artifacts.

Three sources of truth for what a secret is:
1. exact values of the secrets the configuration names (environment variables, files);
2. the regexes of `detect-secrets`' provider plugins (AWS, GitHub, GitLab, OpenAI, Slack,
   private keys, JWTs, basic-auth URLs, …) — not its entropy, keyword or public-IP plugins,
   which flag ordinary server-log lines;
3. patterns for tokens detect-secrets lacks (Hugging Face `hf_…`, current OpenAI/Anthropic
   keys, whole PEM private-key blocks, bearer tokens).

Speed matters because every event passes through here: a single combined *trigger* regex,
each branch a cheap necessary condition of some rule, screens the text first; only text that
trips a trigger is scanned with every rule (the slow, exact path).
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
    ("API Key", r"\bsk-(?:proj-|ant-(?:api\d\d-)?|svcacct-)?[A-Za-z0-9_\-]{20,}", 0),
    (
        "Private Key Block",
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END[A-Z0-9 ]*PRIVATE KEY"
        r"(?: BLOCK)?-----|$)",
        0,
    ),
    ("Bearer Token", r"(?i:\bbearer)\s+([A-Za-z0-9_\-.=+/]{16,})", 1),
    ("Basic Auth Credentials", r"://[^:/?#\[\]@!$&'()*+,;=\s\"]+:([^/?#\[\]@\s\"]+)@", 1),
]

# Cheap necessary conditions of the rules whose own regex is slow (case-insensitive, or no
# literal lead). Rules that start with a literal are their own trigger. Case-insensitive
# conditions are matched against the lowercased text, which is much faster than (?i).
_TRIGGERS = [
    r"AKC|AP[\dA-F]",  # Artifactory
    r"\.[\w-]{6}\.[\w-]{27}",  # Discord
    r"-us\d",  # Mailchimp
    r"k_live_",  # Stripe
    r":[\w-]{35}",  # Telegram
    r"hf_[A-Za-z0-9]{30}",
    r"sk-[A-Za-z0-9_\-]{20}",
    r"-----BEGIN|PuTTY-User-Key",
    r"://[^/\s\"@]+@",  # credentials in a URL
]
_LOWER_TRIGGERS = [
    r"aws",
    r"cl(?:ou|oudant)?[_-]?(?:api)?(?:key|pwd|pw|pass|token|secret)|cloudant",
    r"ibm|cloud[_-]?iam|cos[_-]?hmac|secret[_-]?access|access[_-]?key",
    r"xox|hooks\.slack",
    r"softlayer|sl[_-]?(?:api)?[_-]?(?:key|pwd|pass|token)",
    r"bearer",
]

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
            rules.append(_Rule(label, pattern, group))
    return tuple(rules)


@lru_cache(maxsize=1)
def _literal_led_triggers() -> tuple[str, ...]:
    """Plugin patterns that are cheap because they start with a literal: use them as-is."""
    cheap = []
    for rule in _plugin_rules():
        p = rule.pattern.pattern
        if rule.pattern.flags & re.VERBOSE or p.startswith(("(?:(?<=", "\\d", "[", "(?:\\s")):
            continue
        if p.startswith("(") or p[:1].isalnum() or p.startswith(("\\/", "://", "sk-")):
            cheap.append(p)
    return tuple(cheap)


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
        triggers = list(_literal_led_triggers()) + _TRIGGERS + value_alts
        self._trigger = re.compile("|".join(f"(?:{t})" for t in triggers), re.MULTILINE)
        self._trigger_low = re.compile("|".join(f"(?:{t})" for t in _LOWER_TRIGGERS))
        self._rules = _plugin_rules()
        # Event payloads repeat the same strings (task ids, metric names, enum values).
        self._clean: dict[str, None] = {}

    # --- text -----------------------------------------------------------------------------

    def might_contain_secret(self, text: str) -> bool:
        return (
            self._trigger.search(text) is not None
            or self._trigger_low.search(text.lower()) is not None
        )

    def text(self, text: str) -> str:
        if not text or not self.might_contain_secret(text):
            return text
        return self._scrub(text)

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
        for rule in self._rules:
            if rule.pattern.search(out) is None:
                continue
            out = _replace(out, rule)
        return out

    # --- structured values ------------------------------------------------------------------

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
        text = data.decode("utf-8")
        if not self.might_contain_secret(text):
            return data
        return orjson.dumps(self.value(orjson.loads(data)))


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
