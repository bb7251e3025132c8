"""Errors raised by what acts on the world (engines, tools, bench, loop)."""


class HarnessError(Exception):
    """Base class; messages are one line naming the file, field, process or value."""
