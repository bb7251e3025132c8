"""Errors raised by the journal."""


class WikiError(Exception):
    """Base class; messages are one line."""
