"""Diagnose online and monitor an endpoint: rules over /metrics windows and logs."""
