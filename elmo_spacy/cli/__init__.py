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


from . import elmo_format, pretrain  # noqa: E402,F401  (registers the commands)
