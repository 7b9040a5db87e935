"""The `elmo-spacy` command line: thin typer commands that call the library."""

import contextlib
import inspect
import warnings
from pathlib import Path

import click
import typer
from typer.core import TyperCommand, TyperGroup

from ..errors import ElmoSpacyError
from ..files import describe_os_error


class _NoFlagTypes:
    """No `<bool>` type in the help of flags (--help, --resume, ...)."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class _Command(_NoFlagTypes, TyperCommand):
    pass


class _Group(_NoFlagTypes, TyperGroup):
    pass


app = typer.Typer(
    cls=_Group,
    name="elmo-spacy",
    no_args_is_help=True,
    add_completion=False,
)


def _show_version(show: bool) -> None:
    if show:
        import spacy
        import torch

        from .. import __version__

        typer.echo(
            f"elmo-spacy {__version__} (spaCy {spacy.__version__}, PyTorch {torch.__version__})"
        )
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    version: bool = typer.Option(
        False,
        "--version",
        callback=_show_version,
        is_eager=True,
        help="Show the versions of elmo-spacy, spaCy and PyTorch, and exit.",
    ),
) -> None:
    """ELMo for spaCy: prepare a corpus and pretrain a biLM; convert bilm-tf and ELMoForManyLangs models, export bilm-tf; embed a corpus; export a biLM for serving (ONNX, torch.export)."""
    ctx.with_resource(warnings_as_lines())


@contextlib.contextmanager
def warnings_as_lines():
    """While a command runs, show a warning aimed at its caller's line as one
    yellow line ("RuntimeWarning: ..."): under the command line that caller
    is typer's code, not the user's."""
    machinery = tuple(str(Path(module.__file__).parent) for module in (typer, click))
    show = warnings.showwarning

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if str(filename).startswith(machinery):
            typer.secho(f"{category.__name__}: {message}", fg="yellow", err=True)
        else:
            show(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.showwarning = show_warning
        yield


@contextlib.contextmanager
def errors_to_exit():
    """Turn the errors a user can act on, `ElmoSpacyError` and errors straight
    from the OS, into a red message and exit code 1; any other error is a bug
    and keeps its traceback."""
    try:
        yield
    except (ElmoSpacyError, OSError) as error:
        typer.secho(_message(error), fg="red", err=True)
        raise typer.Exit(1) from error


def _message(error: Exception) -> str:
    """The error's own message, or for one straight from the OS ("[Errno 17]
    File exists: 'x'"), the path it names, what that means and what to do."""
    if not isinstance(error, OSError) or error.errno is None:
        return str(error)
    paths = [p for p in (error.filename, error.filename2) if p is not None]
    where = " -> ".join(str(p) for p in paths)
    return f"{where}: {describe_os_error(error)}" if where else describe_os_error(error)


def parse_part(part: str | None) -> tuple[int, int]:
    """ "K/N" (the --part of embed and prepare) -> (K, N), 0 <= K < N; None -> (0, 1)."""
    if part is None:
        return 0, 1
    try:
        keep, of = (int(number) for number in part.split("/"))
    except ValueError:
        keep, of = -1, 0
    if not 0 <= keep < of:
        raise ElmoSpacyError(
            f"--part {part}: give K/N with 0 <= K < N, e.g. --part 0/4 to --part 3/4 for four parts"
        )
    return keep, of


from . import elmo_format, embed, export, prepare, pretrain  # noqa: E402,F401  (registers the commands)


def _reflowed(text: str) -> str:
    """`text` with each paragraph on one line: typer's rich help keeps a
    docstring's line breaks, which the terminal then breaks again."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


for _info in app.registered_commands:
    _info.help = _reflowed(_info.help or inspect.getdoc(_info.callback) or "")
    if _info.cls in (None, TyperCommand):
        _info.cls = _Command
