"""The `elmo-spacy` command line: thin typer commands that call the library."""

import typer

app = typer.Typer(
    name="elmo-spacy",
    help="ELMo for spaCy: pretrain a biLM, convert and export bilm-tf models.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """ELMo for spaCy: pretrain a biLM, convert and export bilm-tf models."""


class errors_to_exit:
    """Turn the library's errors about inputs (ValueError, OSError: what was
    wrong, where, and what to do) into a red message and exit code 1."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, (ValueError, OSError)):
            typer.secho(_message(error), fg="red", err=True)
            raise typer.Exit(1) from error
        return False


def _message(error: Exception) -> str:
    """The error's own message, or for an error straight from the OS ("[Errno
    17] File exists: 'x'"), the path it names, what that means and what to do."""
    if not isinstance(error, OSError) or error.errno is None:
        return str(error)
    from ..bilm.files import describe_os_error

    paths = [p for p in (error.filename, error.filename2) if p is not None]
    where = " -> ".join(str(p) for p in paths)
    return f"{where}: {describe_os_error(error)}" if where else describe_os_error(error)


from . import elmo_format, embed, pretrain  # noqa: E402,F401  (registers the commands)
