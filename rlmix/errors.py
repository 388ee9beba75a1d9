"""The one exception type that the CLI turns into a single clear line and a non-zero exit."""


class ConfigError(ValueError):
    """Bad user input: the message names the key(s) to change and what is allowed.

    Raise it for any input a user can fix (config values, paths, task files, model dirs).
    The CLI prints ``error: <message>`` on one line and exits with status 2; no traceback.
    """
