"""Secrets in specs are refused when a spec is read: a deployment point, runtime profile or
task definition YAML names the environment variable that holds a secret, never the secret.

`secret_problems(path, data, node)`: one `FILE:LINE: field.path: looks like a secret (<kind>);
reference it by environment variable name instead` per finding, [] when there is none. What
counts: a provider token or private key anywhere (a value, a key, an argv item, a note), a
literal value under a secret name (`api_key: sk-…`, `password: hunter2`, `--api-key X` in
an argv, `{name: DB_PASSWORD, value: …}`), a token split over a key and its value, and the
value of any secret-named variable of this process (`redactor.secret_values_from`). What does
not: a reference to a variable (`$HF_TOKEN`, `${HF_TOKEN}`, `api_key: OPENAI_API_KEY`,
`secrets: [HF_TOKEN]`), a name that says where a secret is (`api_key_env`, `secret_file`),
placeholders (`api_key: null`). A task's `id` is left to the id check (the ledger refuses a
stream name that looks like a secret, in those words). The message never holds the secret:
a key that is (or may start) one is shown as `[REDACTED]` in the field path
(`locate.shown`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..yamlio import dotted_path, line_of
from .locate import locate, shown
from .redactor import DEFAULT_SECRET_ENV, Redactor, secret_values_from


def secret_problems(path: str | Path, data: Any, node: yaml.Node | None) -> list[str]:
    red = Redactor(secret_values_from(DEFAULT_SECRET_ENV, ()))
    out = []
    for loc, kind in locate(red, data, names_ok=True):
        if loc == ("id",):  # an id has its own refusal (`task id looks like a secret`)
            continue
        out.append(f"{path}:{line_of(node, loc)}: {dotted_path(shown(red, loc))}: looks like "
                   f"a secret ({kind}); reference it by environment variable name instead")
    return out
