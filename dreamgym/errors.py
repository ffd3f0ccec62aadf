"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""


class DreamgymError(Exception):
    """Bad input or a broken precondition, with a message that names the problem and the fix."""


class ConfigError(DreamgymError):
    """A parameter file or value that cannot be used, with what to change."""
