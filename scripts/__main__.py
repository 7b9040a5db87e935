"""`python -m scripts <command>`: the study's commands (see `python -m scripts --help`)."""

from .commands import app

app()
