"""The study's command line: thin typer commands over the study's modules."""

import typer

app = typer.Typer(
    name="python -m scripts",
    help="The elmo_spacy study: corpora, baselines, training, evaluation and comparison.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """The elmo_spacy study: corpora, baselines, training, evaluation and comparison."""


from . import baselines, compare, contexts, corpus, evaluate, tokens, train  # noqa: E402,F401  (registers the commands)
