"""`python -m scripts contexts`: the same word in two senses, contextual (ELMo) vs static vectors."""

from pathlib import Path

import typer

from . import app


@app.command("contexts")
def contexts_command(
    model_dir: Path = typer.Argument(
        ..., exists=True, file_okay=False, help="A pipeline with an `elmo` pipe"
    ),
    reference: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="Docs (.spacy) to find nearest neighbours in"
    ),
    n_docs: int = typer.Option(500, help="Use the first N reference docs"),
    n_neighbours: int = typer.Option(3, help="Neighbours to show per occurrence"),
) -> None:
    """Print, for words like "bank" (river / loans), the cosine of the word's two
    vectors and its nearest tokens: at the top biLSTM layer, and at layer 0,
    the context-free token encoding that a static embedding gives."""
    import itertools

    import spacy
    from spacy.tokens import DocBin

    from elmo_spacy.layers import get_runner

    from ..contexts import compare_senses

    nlp = spacy.load(model_dir, exclude=["textcat"])
    gold = DocBin().from_disk(reference).get_docs(nlp.vocab)
    docs = list(nlp.pipe(doc.text for doc in itertools.islice(gold, n_docs)))
    top = get_runner(nlp.get_pipe("elmo").model).n_layers - 1  # the last layer on doc._.elmo
    for layer, title in ((top, f"ELMo layer {top} (contextual)"), (0, "layer 0 (static)")):
        typer.echo(f"## {title}\n")
        for word, first, second in compare_senses(nlp, docs, layer, n_neighbours=n_neighbours):
            typer.echo(
                f"{word!r}: cosine between the two contexts = {first.similarity_to_other:.3f}"
            )
            for occurrence in (first, second):
                neighbours = "; ".join(
                    f"{label} ({score:.2f})" for score, label in occurrence.neighbours
                )
                typer.echo(f"  {occurrence.token.doc.text}\n    nearest: {neighbours}")
            typer.echo("")
