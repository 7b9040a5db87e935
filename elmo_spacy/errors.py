"""The one exception type for errors a user can act on: the command line shows
one as a line and exits with 1; any other exception is a bug and keeps its
traceback. It imports nothing, so every subpackage may raise it."""


class ElmoSpacyError(ValueError):
    """An error in what the user gave (a setting, a config, a file, a path),
    with a message that says what was wrong, where, and what to do."""
