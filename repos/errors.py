"""Errors raised by the MonoRepo workspace."""


class RepoError(Exception):
    """Base class; messages are one line."""
