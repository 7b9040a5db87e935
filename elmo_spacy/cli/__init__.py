"""The `elmo-spacy` command line: thin typer commands that call the library."""

import typer

app = typer.Typer(
    name="elmo-spacy",
    help="ELMo for spaCy: pretrain a biLM and use it in spaCy pipelines.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """ELMo for spaCy: pretrain a biLM and use it in spaCy pipelines."""


from . import baselines, compare, contexts, corpus, evaluate, pretrain, train  # noqa: E402,F401  (registers the commands)
