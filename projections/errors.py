"""Errors raised by the read side."""


class ProjectionError(Exception):
    """Base class; messages are one line."""
