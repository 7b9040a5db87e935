"""The one exception type for errors a user can act on.

The library raises `ElmoSpacyError` (or a subclass of it) where its input is
wrong: a setting, a config, a file, a path. The message says what was wrong,
where, and what to do. The command line shows such an error as one line and
exits with 1; any other exception is a bug and keeps its traceback.

It is a `ValueError`, so callers that caught ValueError before still catch it.
This module imports nothing, so every subpackage of the package (the biLM included)
may raise it.
"""


class ElmoSpacyError(ValueError):
    """An error in what the user gave (a setting, a config, a file), with a
    message that says what was wrong, where, and what to do."""
