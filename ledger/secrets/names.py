"""Secret names: the one rule for whether a name (an environment variable, a mapping key, a
CLI flag, the left side of `NAME=value` in text) holds a secret, which values under such a
name are secrets, and the `NAME=value` text rule built on it.

Used by `redactor.Redactor` (text, structured values, JSON), the environment digest of tool
calls and the child-process environment; `redactor` and `locate` use the strengths
(`name_strength`, `is_secret_value`, `pair_strength`) and the text rules too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# The tags redaction writes in place of a secret (`[REDACTED:<kind>]`).
REDACTED = "[REDACTED]"

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


def name_strength(name: str) -> int:
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
    return name_strength(name) != NOT_SECRET


# Values under a secret name that are not secrets: placeholders, unset markers.
_PLACEHOLDERS = frozenset({"none", "null", "nil", "true", "false", "yes", "no", "on", "off",
                           "<set>", "***", "...", "-", "n/a", "unset", "undefined", "~",
                           "<redacted>", "redacted", "********"})
_SHELL_REF = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z_][A-Za-z0-9_]*%")


def is_secret_value(strength: int, value: Any) -> bool:
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
# the value is redacted when NAME is a secret name and the value passes `is_secret_value`.
# An unquoted value at the start of a line (`MY_API_KEY=a b c` in `env` output, a YAML line)
# runs to the end of the line; elsewhere to the next space or delimiter.
# The value may also stand alone on the next line, after `NAME:` ends a line (a header or a
# YAML key split over two lines: `Authorization:` / `  Basic dXNl…`, `password: |` /
# `  hunter2`), unless that line is itself a mapping key, a list item or a comment.
_NEXT_LINE_SEP = (r"[ \t]*:[ \t]*(?:[|>][+-]?[ \t]*)?\r?\n[ \t]*"
                  r"(?![-#][ \t]|[^\s:\"']*:(?:[ \t]|\r?\n|$))")
_ASSIGN = re.compile(
    r"(?:(?<![\w.\-/$\\])|(?<=\\[nrt]))(?:(?P<dash>--)|-)?\\?[\"']?"
    r"(?P<name>[A-Za-z_][\w.\-]{0,199})\\?[\"']?\]?"
    r"(?P<sep>[ \t]*(?:=>?|:(?![/:\\]))[ \t]*|" + _NEXT_LINE_SEP + r"|(?(dash)[ \t]+|(?!)))"
    r"(?P<scheme>(?i:bearer|basic|token|digest)[ \t]+)?"
    r"(?:(?P<vq>\\?[\"'`])(?P<qv>(?:\\.|[^\\\n])*?)(?P=vq)"
    r"|(?P<uv>\$\{\w+\}|(?!=)[^\s\"'`,;&<>(){}\[\]|\\]+))"
)
_LINE_LEAD = re.compile(r"[ \t]*(?:(?:export|set|declare -x)[ \t]+|-[ \t]+)?")
NAMED_SECRET_TAG = "[REDACTED:named-secret]"
_NUMERIC_WORD = re.compile(r"[0-9.,_+\-]*")
_HEAD_WORD = re.compile(r"[^\s\"'`\\]*")


def redact_assignments(text: str) -> str:
    """Apply `_ASSIGN` to `text`; the same object back when nothing is redacted."""
    search = _ASSIGN.search
    pieces: list[str] = []
    last = pos = 0
    n = len(text)
    while pos < n:
        m = search(text, pos)
        if m is None:
            break
        strength = name_strength(m.group("name"))
        quoted = m.group("vq") is not None
        vstart, vend = m.span("qv") if quoted else m.span("uv")
        if strength and is_secret_value(strength, text[vstart:vend]):
            flag = not m.group("sep").strip()
            if flag and not quoted and text.startswith("-", vstart):
                strength = NOT_SECRET  # `--api-key --next-flag`: no value
            elif not flag and not quoted:
                line0 = text.rfind("\n", 0, m.start()) + 1
                if (_LINE_LEAD.fullmatch(text, line0, m.start())  # `NAME=a b c` on its own
                        or "\n" in m.group("sep")):  # the value's own line
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


# `{"name": "DB_PASSWORD", "value": "…"}` and its YAML form (`- name: DB_PASSWORD` /
# `  value: …`, a Kubernetes env entry) in text: the name and its value stand under two
# keys, so `_ASSIGN` sees neither as an assignment. The value is redacted when the name is
# a secret name (the structured walk does the same for a mapping: `redactor._POINTER_KEYS`).
_POINTER_PAIR = re.compile(
    r"(?<![\w])\\?[\"']?(?:name|key|env|var|variable|field)\\?[\"']?[ \t]*[:=][ \t]*"
    r"\\?[\"']?(?P<name>[A-Za-z_][\w.\-]{0,199})\\?[\"']?[ \t]*,?[ \t]*(?:\r?\n[ \t]*)?"
    r"\\?[\"']?(?:value|default)\\?[\"']?[ \t]*[:=][ \t]*"
    r"(?:(?P<vq>\\?[\"'])(?P<qv>(?:\\.|[^\\\n])*?)(?P=vq)"
    r"|(?P<uv>[^\s\"'`,;&<>(){}\[\]|\\]+))"
)


def redact_pointer_pairs(text: str) -> str:
    """Apply `_POINTER_PAIR` to `text`; the same object back when nothing is redacted."""
    if "value" not in text and "default" not in text:  # the pattern's literal, cheaply
        return text
    pieces: list[str] = []
    last = 0
    for m in _POINTER_PAIR.finditer(text):
        strength = name_strength(m.group("name"))
        vstart, vend = m.span("qv") if m.group("vq") is not None else m.span("uv")
        if strength and is_secret_value(strength, text[vstart:vend]):
            pieces.append(text[last:vstart])
            pieces.append(NAMED_SECRET_TAG)
            last = vend
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def pair_strength(items: list[Any] | tuple[Any, ...]) -> int:
    """For a two-item list `[NAME, value]` (an HTTP header as a pair, an environment entry):
    the strength of NAME when it is a secret name written as a name (`MY_API_KEY`,
    `Authorization`, `db_password`), not one lowercase word (`["passwd", "alice"]` is a
    command)."""
    if len(items) != 2:
        return NOT_SECRET
    name, value = items
    if type(name) is not str or type(value) is not str or name.startswith("-"):
        return NOT_SECRET
    if name.isalpha() and name.islower():
        return NOT_SECRET
    if _ENV_NAME.fullmatch(value) and name_strength(value) != NOT_SECRET:
        return NOT_SECRET  # two names (`["HF_TOKEN", "MY_API_KEY"]`): a list, not a pair
    return name_strength(name)
