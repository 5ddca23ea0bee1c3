"""Errors that are the user's to fix: the command line prints them without a traceback."""


class ConfigError(ValueError):
    """A config, an id or an input the user gave is wrong; the message says how to fix it."""


class RunError(RuntimeError):
    """A run had to stop (disk full, training diverged). Nothing is wrong in the code, so
    no traceback: the message says what went wrong, which checkpoint is intact and how to
    go on from it."""

    exit_code = 1  # the command line's exit status


class Interrupted(RunError):
    """A run stopped by a signal (Ctrl-C, SIGTERM) where its state was whole; the exit status
    is the shells' convention for the signal: 128 + its number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.exit_code = 128 + signum
