"""The Safety Guard: human gate (approvals), environment isolation (sandbox), production
read-only, data policy, and the traceable path. The push guard lives with the MonoRepo
(repos/push_guard.py); secrets redaction in ledger/secrets/; review in harness/loop/review.py."""
