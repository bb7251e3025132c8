"""Secret patterns: the regexes of `detect-secrets`' provider plugins (AWS, GitHub, GitLab,
OpenAI, Slack, private keys, JWTs, basic-auth URLs, …, not its entropy, keyword or public-IP
plugins), the patterns for tokens it lacks, and the cheap *triggers* that screen text before
any of them runs.

The rules, triggers and screens are `redactor`'s (and `splits`', `locate`'s) to run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

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
# these (tests/ledger/test_redact.py checks each rule's sample through every scan path), so text
# without a trigger hit holds no secret. Each is (regex, anchors): every match of the regex
# contains one of the literal anchors, so a substring test rules most text out before any
# regex runs. Both also hold on the JSON serialization of a string (hence `\\?` before
# quotes), which lets a whole event be screened in one pass over its JSON bytes.
# The triggers of `_ASSIGN` (see `LOWER_TRIGGER_SPECS`): after the name, its separator and an
# optional opening quote (also JSON-escaped, once or twice); a weak name's value must start
# with a word that is not all digits and punctuation (so `#new-token: 32768` trips nothing).
# (`NAME:` may end a line, the value on the next: `_ASSIGN`'s next-line form; in a JSON
# string the line break and the indentation's tabs are escaped.)
_NL = r"(?:\r?\n|(?:\\r)?\\n)"
_SP = r"[ \t]*+(?:\\t[ \t]*+)*+"
_SEP_T = (r"\\{0,3}[\"'`]?\]?[ \t]*+(?:=|:(?![/:]|\\(?![tnr]))(?:" + _SP
          + r"(?:[|>][+-]?" + _SP + ")?" + _NL + ")?)" + _SP + r"\\{0,3}[\"'`]?")
_WEAK_VALUE_T = r"[ \t]*+[0-9.,_+\-]*+[^\s0-9.,_+\-\"'`\\]"
_WEAK = r"[0-9_.\-]*+" + _SEP_T + _WEAK_VALUE_T
_STRONG = r"[\w.\-\x80-\xff]*+" + _SEP_T + r"\S"
_IBM = r"\\?[\"']?\]? *+[:=>]*+ *+\\?[\"']?[a-z0-9_\-]{24}"
TRIGGER_SPECS: list[tuple[str, tuple[str, ...]]] = [
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
    # Mailchimp; and `--secret-flag value` (the `_ASSIGN` rule)
    (r"-(?:us\d|-\\?[\"']?[\w.\-\x80-\xff]*?(?i:key|token|auth|pat|pwd|secret|pass|cred)"
     r"[\w.\-\x80-\xff]*\\?[\"']?\]?[ \t]+[^\s\-])", ("-us", "--")),
    (r":(?<=\d{8}:)[\w-]{35}", (":",)),  # Telegram (not the digits of `sha256:<hex>`)
    ("hf_", ()),  # Hugging Face
]
# Matched against the lowercased text (much faster than (?i)): the case-insensitive rules.
LOWER_TRIGGER_SPECS: list[tuple[str, tuple[str, ...]]] = [
    ("aws", ()),
    ("xox", ()), (r"hooks\.slack", ("hooks.slack",)),  # Slack
    ("softlayer", ()),
    ("bearer", ()),
    # Cloudant, IBM Cloud IAM, IBM COS, SoftLayer: a key-ish word, a separator, a long value
    # (_IBM); and `NAME=value` under a secret name (the `_ASSIGN` rule): a weak word ends the
    # name and the value's first word is not a number (_WEAK), a strong word may be followed
    # by more of the name (_STRONG). One pass per leading literal: each pass over a long log
    # costs about as much as another rule.
    ("key(?:" + _IBM + "|s?" + _WEAK + ")", ("key",)),
    ("token(?:" + _IBM + "|" + _WEAK + ")", ("token",)),
    ("p(?:(?:wd?|ass(?:word)?)" + _IBM + "|(?:wd|at)" + _WEAK + "|ass(?:w|phrase)" + _STRONG
     + ")", ("pw", "pass", "pat")),
    ("auth(?:orization)?" + _WEAK, ("auth",)),
    ("secret" + _STRONG, ("secret",)),
    ("cred(?:s|ential)" + _STRONG, ("cred",)),
    # `{"name": "MY_API_KEY", "value": "…"}` in text (`_POINTER_PAIR`): its `value` (or
    # `default`) key and separator. The name is on the same line or the one before, which
    # the long-text scan's region (the hit's line and its neighbours) takes in.
    (r"value\\{0,3}[\"']?[ \t]*+[:=]", ("value",)),
    (r"default\\{0,3}[\"']?[ \t]*+[:=]", ("default",)),
]
TRIGGERS = [t for t, _ in TRIGGER_SPECS]
LOWER_TRIGGERS = [t for t, _ in LOWER_TRIGGER_SPECS]


@dataclass(frozen=True)
class Screen:
    """One trigger for the screening pass: literal anchors, then the regex (None: the anchor
    is the whole trigger)."""

    anchors: tuple[bytes, ...]
    pattern: re.Pattern[bytes] | None

    def hit(self, data: bytes) -> bool:
        for a in self.anchors:
            if a in data:
                return self.pattern is None or self.pattern.search(data) is not None
        return False


def screens(specs: list[tuple[str, tuple[str, ...]]]) -> list[Screen]:
    out = []
    for regex, anchors in specs:
        if anchors:
            out.append(Screen(tuple(a.encode() for a in anchors),
                               re.compile(as_bytes_trigger(regex))))
        else:  # a plain literal
            out.append(Screen((regex.encode(),), None))
    return out



@dataclass(frozen=True)
class Rule:
    label: str
    pattern: re.Pattern[str]
    group: int  # 0: replace the whole match, n: replace group n only


@lru_cache(maxsize=1)
def plugin_rules() -> tuple[Rule, ...]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import BasePlugin

    rules: list[Rule] = []
    for label, regex, group in _EXTRA_RULES:
        rules.append(Rule(label, re.compile(regex, re.DOTALL), group))
    # The library types the values with an unbound TypeVar (type[Never]): they are plugins.
    plugins: dict[str, type[BasePlugin]] = (
        get_mapping_from_secret_type_to_class())  # type: ignore[assignment]
    for label, cls in plugins.items():
        if cls.__name__ in _SKIPPED_PLUGINS:
            continue
        for pattern in getattr(cls(), "denylist", ()):
            group = 1 if pattern.groups >= 1 and cls.__name__ not in {
                "GitHubTokenDetector",
                "GitLabTokenDetector",
                "NpmDetector",
            } else 0
            rules.append(Rule(label, _without_borders(pattern), group))
    return tuple(rules)


def _without_borders(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """Artifactory's patterns consume the whitespace around the token; as lookarounds the
    replacement keeps it (and the line structure of a log)."""
    p = pattern.pattern
    if p.startswith(r'(?:\s|=|:|"|^)') and p.endswith(r'(?:\s|"|$)'):
        p = r'(?:(?<=[\s=:"])|^)' + p[len(r'(?:\s|=|:|"|^)'):-len(r'(?:\s|"|$)')]
        return re.compile(p + r'(?=[\s"]|$)', pattern.flags)
    return pattern


def as_bytes_trigger(pattern: str) -> bytes:
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


def redact_matches(text: str, rule: Rule) -> str:
    tag = f"[REDACTED:{rule.label}]"

    def sub(m: re.Match[str]) -> str:
        if rule.group and m.lastindex and m.group(rule.group) is not None:
            start, end = m.span(rule.group)
            s0 = m.start()
            whole = m.group(0)
            return whole[: start - s0] + tag_lines(whole[start - s0:end - s0], tag) + \
                whole[end - s0 :]
        return tag_lines(m.group(0), tag)

    return rule.pattern.sub(sub, text)


_LINE_BREAK = re.compile(r"(\r?\n)")


def tag_lines(secret: str, tag: str) -> str:
    """`tag` in place of `secret`, once per line it spans: a redacted text keeps its line
    breaks (a private-key block becomes one tag per line), so line numbers stay right."""
    if "\n" not in secret:
        return tag
    return "".join(p if i % 2 else (tag if p else "")
                   for i, p in enumerate(_LINE_BREAK.split(secret)))
