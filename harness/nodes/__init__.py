"""The Node Registry: hosts and their observations (`registry`, `observe`), leases on their
resources (`claims`), and the rule that decides when a stale claim may be cleaned up
(`stale`)."""
