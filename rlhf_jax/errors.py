"""Errors that are the user's to fix: the command line prints them without a traceback."""


class ConfigError(ValueError):
    """A config, an id or an input the user gave is wrong; the message says how to fix it."""


class RunError(RuntimeError):
    """A run had to stop (disk full, training diverged). Nothing is wrong in the code, so
    no traceback: the message says what went wrong, which checkpoint is intact and how to
    go on from it."""
