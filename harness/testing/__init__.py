"""Test doubles that stay importable for benchmarks and tests: `scripted_server`, an
OpenAI-compatible streaming server whose timing is scripted (no model); `scripted_chat`,
`scripted_messages` and `scripted_responses`, model APIs (chat completions, Anthropic
Messages, OpenAI Responses) that answer an agent from a script; `loopback_bridge`, a loopback
port inside a network namespace that leads to a server outside it."""
