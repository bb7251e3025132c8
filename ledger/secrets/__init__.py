"""Secrets never reach the ledger: what a secret is, redacting it, and refusing it in specs.

Modules, bottom to top (each imports only those before it):
- `names`: the secret-name rule (`is_secret_name`, strengths), which values under such a name
  are secrets, the `NAME=value` text rules, secret values from the environment;
- `patterns`: detect-secrets' provider regexes, the extra token patterns, the cheap triggers
  and screens, `tag_lines`;
- `splits`: a token wrapped over lines or cut between a key and its value;
- `redactor`: the `Redactor` (text, structured values, JSON bytes), the configured secret
  values (`DEFAULT_SECRET_ENV`, `secret_values_from`), `redact_message`;
- `stream`: `StreamRedactor`, redaction of a stream of chunks (a token cut by a boundary);
- `locate`: where a structured value holds a secret, and a location fit to print
  (`locate`, `shown`), without repeating the secret;
- `spec_check`: secrets in a point, profile or task YAML refused (`secret_problems`).
"""
