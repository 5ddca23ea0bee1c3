"""Errors that are the user's to fix: the command line prints them without a traceback."""


class ConfigError(ValueError):
    """A config, an id or an input the user gave is wrong; the message says how to fix it."""
