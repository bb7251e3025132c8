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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

# --- secret names -------------------------------------------------------------------------
# One rule says whether a name (an environment variable, a mapping key, a CLI flag, the left
# side of `NAME=value` in text) holds a secret. The environment digest, the structured-data
# walk and the text rule all use it. Names are split into words on `_ - . /`, spaces and
# camelCase; only the last dotted segment counts (`config.env.MY_API_KEY` is `MY_API_KEY`).
#
# Strong words (secret, password, passwd, passphrase, credential(s), creds) make the name
# secret wherever they stand, unless the name ends in a word that makes it a reference to the
# secret rather than the secret itself (`PASSWORD_FILE`, `secret_env`, `SECRET_NAME`).
# Weak words (key, token, auth, authorization, pat, pwd) must be the last word
# (`MY_API_KEY`, `HF_TOKEN`, `apiKey`, not `KEYBOARD`, `TOKENIZERS_PARALLELISM`,
# `max_new_tokens`, `SSH_AUTH_SOCK`), not follow a word that makes them ordinary
# (`bos_token`, `time_to_first_token`, `sort_key`, `public_key`), and count alone only in
# an upper-case name (`TOKEN` but not `token` or `key`, which are ordinary JSON keys, nor
# `PWD`, the shell's working directory) or as `auth`/`Authorization`. Under a weak name, a
# value whose first word is a number is not a secret (`#new-token: 32768`); under a strong
# one, any non-empty value is.

_STRONG_WORDS = frozenset({"secret", "secrets", "password", "passwords", "passwd", "passphrase",
                           "credential", "credentials", "creds"})
_STRONG_ENDINGS = ("password", "passwd", "passphrase", "secret")  # pgpassword, clientsecret
_WEAK_WORDS = frozenset({"key", "keys", "token", "auth", "authorization", "pat", "pwd"})
# One-word compounds that end in a weak word: apikey, accesstoken, …
_COMPOUND_HEADS = frozenset({"api", "access", "secret", "private", "signing", "encryption",
                             "master", "client", "service", "license", "auth", "app", "refresh",
                             "session", "bearer", "oauth", "bot", "user", "id"})
# Words after a strong word that make the name a reference to a secret, not the secret.
_REFERENCE_ENDINGS = frozenset({
    "file", "files", "path", "paths", "dir", "directory", "name", "names", "env", "envs", "id",
    "ids", "ref", "arn", "type", "types", "mode", "policy", "length", "len", "count", "enabled",
    "required", "source", "provider", "manager", "backend", "store", "rotation", "prompt",
    "hint", "field", "fields", "label", "var", "vars", "variable", "variables", "version",
    "expiry", "expires", "expiration", "ttl", "set", "reset", "changed", "at", "format",
    "kind", "scope", "scopes", "location", "mount", "volume", "command", "cmd", "helper",
})
# Words before `token`/`key` that make them ordinary: tokenizer and count vocabulary, and
# keys that are not credentials.
_ORDINARY_BEFORE = {
    "token": frozenset({
        "bos", "eos", "pad", "unk", "cls", "sep", "mask", "stop", "start", "end", "special",
        "image", "video", "audio", "vision", "first", "last", "next", "prev", "previous",
        "output", "input", "prompt", "new", "cached", "per", "max", "min", "num", "n", "total",
        "avg", "mean", "think", "thinking", "reasoning", "tool", "eot", "eom", "boi", "eoi",
        "placeholder", "sampled", "generated", "decode", "prefill", "chat", "system",
        "assistant", "begin", "eod", "fim", "middle", "suffix", "prefix", "sentinel", "word",
        "subword", "added", "additional", "vocab", "draft", "spec", "speculative",
    }),
    "key": frozenset({
        "sort", "cache", "partition", "primary", "foreign", "hash", "dict", "lookup", "group",
        "join", "index", "shard", "route", "routing", "map", "unique", "composite", "row",
        "column", "metric", "config", "kv", "public", "pub", "idempotency", "dedup", "order",
        "lock", "cursor", "record", "field", "object", "sharding", "bucket", "host", "ssh",
        "gpg", "pgp", "hot", "shortcut", "press", "media", "music", "piano", "dimension",
        "query", "value", "attention", "rope", "head", "heads", "layer", "tensor", "weight",
    }),
}
_ORDINARY_BEFORE["keys"] = _ORDINARY_BEFORE["key"]
_NAME_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[^\x00-\x7f]+")
_NAME_CACHE: dict[str, int] = {}

NOT_SECRET, WEAK, STRONG = 0, 1, 2


def _name_strength(name: str) -> int:
    """0: not a secret name; 1: weak (key, token, …: strings only); 2: strong (any value)."""
    s = _NAME_CACHE.get(name)
    if s is None:
        s = _compute_strength(name)
        if len(_NAME_CACHE) > 65536:
            _NAME_CACHE.clear()
        _NAME_CACHE[name] = s
    return s


def _compute_strength(name: str) -> int:
    if len(name) > 200:
        return NOT_SECRET
    segment = re.split(r"[./]", name.strip("-_ \"'[]"))[-1]
    words = [w.lower() for w in _NAME_WORD.findall(segment)]
    if not words:
        return NOT_SECRET
    last = words[-1]
    if any(w in _STRONG_WORDS or w.endswith(_STRONG_ENDINGS) for w in words):
        strong_last = last in _STRONG_WORDS or last.endswith(_STRONG_ENDINGS)
        if strong_last or last not in _REFERENCE_ENDINGS:
            return STRONG
    if last in _WEAK_WORDS:
        if len(words) == 1:
            if last in ("auth", "authorization"):
                return WEAK
            return WEAK if segment.isupper() and last != "pwd" else NOT_SECRET
        ordinary = _ORDINARY_BEFORE.get(last)
        if ordinary is not None and words[-2] in ordinary:
            return NOT_SECRET
        return WEAK
    for weak in ("key", "token"):
        if last.endswith(weak) and last[: -len(weak)] in _COMPOUND_HEADS:  # apikey, authtoken
            return WEAK
    return NOT_SECRET


def is_secret_name(name: str) -> bool:
    """Whether a variable, key or flag of this name holds a secret (see the rule above)."""
    return _name_strength(name) != NOT_SECRET


# Values under a secret name that are not secrets: placeholders, unset markers.
_PLACEHOLDERS = frozenset({"none", "null", "nil", "true", "false", "yes", "no", "on", "off",
                           "<set>", "***", "...", "-", "n/a", "unset", "undefined", "~",
                           "<redacted>", "redacted", "********"})
_SHELL_REF = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z_][A-Za-z0-9_]*%")


def _is_secret_value(strength: int, value: Any) -> bool:
    """Whether `value`, found under a name of this strength, is to be redacted."""
    t = type(value)
    if t is str:
        v = value.strip()
        if not v or v.lower() in _PLACEHOLDERS or v.startswith(REDACTED[:-1]):
            return False
        if _SHELL_REF.fullmatch(v):  # a reference to a variable, not its value
            return False
        if strength == STRONG:
            return True
        head = _HEAD_WORD.match(v).group()  # type: ignore[union-attr]
        return bool(head) and not _NUMERIC_WORD.fullmatch(head)
    if t is int or t is float:
        return strength == STRONG
    return False


def env_secret_values(env: Mapping[str, str], names: Iterable[str] = ()) -> list[str]:
    """Values of the variables in `env` that are named in `names` or whose names look secret
    (`is_secret_name`): what a child process with this environment could print. Trivial
    values (short, one plain word, all digits, placeholders) are left out: redacting them
    everywhere would redact ordinary text."""
    named = set(names)
    out = []
    for k, v in env.items():
        if (k in named or is_secret_name(k)) and _nontrivial(v):
            out.append(v)
    return out


def _nontrivial(v: str) -> bool:
    v = v.strip()
    return (len(v) >= 6 and v.lower() not in _PLACEHOLDERS and not v.isdigit()
            and not (v.isalpha() and (v.islower() or v.isupper())))


# `NAME=value`, `NAME: value`, `"NAME": "value"`, `NAME => 'value'`, `--name value` in text:
# the value is redacted when NAME is a secret name and the value passes `_is_secret_value`.
# An unquoted value at the start of a line (`MY_API_KEY=a b c` in `env` output, a YAML line)
# runs to the end of the line; elsewhere to the next space or delimiter.
_ASSIGN = re.compile(
    r"(?:(?<![\w.\-/$\\])|(?<=\\[nrt]))(?:(?P<dash>--)|-)?\\?[\"']?"
    r"(?P<name>[A-Za-z_][\w.\-]{0,199})\\?[\"']?\]?"
    r"(?P<sep>[ \t]*(?:=>?|:(?![/:\\]))[ \t]*|(?(dash)[ \t]+|(?!)))"
    r"(?P<scheme>(?i:bearer|basic|token|digest)[ \t]+)?"
    r"(?:(?P<vq>\\?[\"'`])(?P<qv>(?:\\.|[^\\\n])*?)(?P=vq)"
    r"|(?P<uv>\$\{\w+\}|(?!=)[^\s\"'`,;&<>(){}\[\]|\\]+))"
)
_LINE_LEAD = re.compile(r"[ \t]*(?:(?:export|set|declare -x)[ \t]+|-[ \t]+)?")
NAMED_SECRET_TAG = "[REDACTED:named-secret]"
# The triggers of `_ASSIGN` (see `_LOWER_TRIGGER_SPECS`): after the name, its separator and an
# optional opening quote (also JSON-escaped, once or twice); a weak name's value must start
# with a word that is not all digits and punctuation (so `#new-token: 32768` trips nothing).
_SEP_T = r"\\{0,3}[\"'`]?\]?[ \t]*+(?:=|:(?![/:\\]))[ \t]*+\\{0,3}[\"'`]?"
_WEAK_VALUE_T = r"[ \t]*+[0-9.,_+\-]*+[^\s0-9.,_+\-\"'`\\]"
_WEAK = r"[0-9_.\-]*+" + _SEP_T + _WEAK_VALUE_T
_STRONG = r"[\w.\-\x80-\xff]*+" + _SEP_T + r"\S"
_IBM = r"\\?[\"']?\]? *+[:=>]*+ *+\\?[\"']?[a-z0-9_\-]{24}"
_NUMERIC_WORD = re.compile(r"[0-9.,_+\-]*")
_HEAD_WORD = re.compile(r"[^\s\"'`\\]*")


def _redact_assignments(text: str) -> str:
    """Apply `_ASSIGN` to `text`; the same object back when nothing is redacted."""
    search = _ASSIGN.search
    pieces: list[str] = []
    last = pos = 0
    n = len(text)
    while pos < n:
        m = search(text, pos)
        if m is None:
            break
        strength = _name_strength(m.group("name"))
        quoted = m.group("vq") is not None
        vstart, vend = m.span("qv") if quoted else m.span("uv")
        if strength and _is_secret_value(strength, text[vstart:vend]):
            flag = not m.group("sep").strip()
            if flag and not quoted and text.startswith("-", vstart):
                strength = NOT_SECRET  # `--api-key --next-flag`: no value
            elif not flag and not quoted:
                line0 = text.rfind("\n", 0, m.start()) + 1
                if _LINE_LEAD.fullmatch(text, line0, m.start()):  # `NAME=a b c` on its own
                    eol = text.find("\n", vend)
                    eol = len(text) if eol < 0 else eol
                    vend += len(text[vend:eol].rstrip(" \t\r"))
            if strength:
                pieces.append(text[last:vstart])
                pieces.append(NAMED_SECRET_TAG)
                last = pos = vend
                continue
        pos = m.end("sep")  # the value may itself be a `NAME=value`
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


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
    # Mailchimp; and `--secret-flag value` (the `_ASSIGN` rule)
    (r"-(?:us\d|-\\?[\"']?[\w.\-\x80-\xff]*?(?i:key|token|auth|pat|pwd|secret|pass|cred)"
     r"[\w.\-\x80-\xff]*\\?[\"']?\]?[ \t]+[^\s\-])", ("-us", "--")),
    (r":(?<=\d{8}:)[\w-]{35}", (":",)),  # Telegram (not the digits of `sha256:<hex>`)
    ("hf_", ()),  # Hugging Face
]
# Matched against the lowercased text (much faster than (?i)): the case-insensitive rules.
_LOWER_TRIGGER_SPECS: list[tuple[str, tuple[str, ...]]] = [
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
        self._plain_keys: dict[str, None] = {}  # mapping keys that need no name check

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
        return _redact_assignments(out) if self._assignments else out

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
                    strength = _name_strength(k)
                    if strength:
                        if _named_secret(strength, v):
                            return True
                    elif k in _POINTER_KEYS:
                        pointer = True
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
                strength = _pointed_strength(value)
                if strength and any(_named_secret(strength, value[k]) for k in _POINTED_VALUES
                                    if k in value):
                    return True
            return False
        if t is list or t is tuple:
            flag = NOT_SECRET  # the strength of a `--secret-flag` just before
            for v in value:
                tv = type(v)
                if tv is str:
                    if v not in clean and not self._clean_str(v):
                        return True
                    if flag and not v.startswith("-") and _is_secret_value(flag, v):
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
            pointed = _pointed_strength(value)
            out = {}
            for k, v in value.items():
                strength = _name_strength(k) if isinstance(k, str) else NOT_SECRET
                if not strength and pointed and k in _POINTED_VALUES:
                    strength = pointed
                key = self._leaf(k) if isinstance(k, str) else k
                out[key] = self._named_value(strength, v) if strength else self.value(v)
            return out
        if isinstance(value, list | tuple):
            flagged = _flag_values(value)
            return type(value)(NAMED_SECRET_TAG if i in flagged else self.value(v)
                               for i, v in enumerate(value))
        return value

    def _named_value(self, strength: int, v: Any) -> Any:
        if _is_secret_value(strength, v):
            return NAMED_SECRET_TAG
        if isinstance(v, list | tuple):
            return type(v)(NAMED_SECRET_TAG if _is_secret_value(strength, x) else self.value(x)
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
_POINTED_VALUES = ("value", "a", "b", "old", "new", "before", "after", "from", "to", "default",
                   "current", "previous")
# Every secret name holds one of these (lowercased): the screen of `json_bytes`.
_NAME_STEMS = re.compile(rb"key|token|auth|pat|pwd|secret|pass|cred")


def _named_secret(strength: int, v: Any) -> bool:
    """Whether `v`, under a name of this strength, is (or, a list, holds) a secret value."""
    if _is_secret_value(strength, v):
        return True
    tv = type(v)
    if tv is list or tv is tuple:
        return any(_is_secret_value(strength, x) for x in v)
    return False


def _pointed_strength(d: dict[Any, Any]) -> int:
    for k in _POINTER_KEYS:
        v = d.get(k)
        if type(v) is str and len(v) <= 200:
            strength = _name_strength(v)
            if strength:
                return strength
    return NOT_SECRET


def _flag_strength(item: str) -> int:
    """For a list item `--api-key` (a flag whose value is the next item): its name's strength."""
    if "=" in item or len(item) > 200:
        return NOT_SECRET
    return _name_strength(item)


def _flag_values(items: list[Any] | tuple[Any, ...]) -> set[int]:
    """Indexes of the items that follow a secret-named flag (`--api-key`, `-token`)."""
    out: set[int] = set()
    for i in range(len(items) - 1):
        flag, nxt = items[i], items[i + 1]
        if (type(flag) is str and flag.startswith("-") and type(nxt) is str
                and not nxt.startswith("-")):
            strength = _flag_strength(flag)
            if strength and _is_secret_value(strength, nxt):
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
