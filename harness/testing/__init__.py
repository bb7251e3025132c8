"""Test doubles that stay importable for benchmarks and tests: `scripted_server`, an
OpenAI-compatible streaming server whose timing is scripted (no model)."""
