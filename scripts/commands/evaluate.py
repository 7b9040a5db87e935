"""`python -m scripts evaluate`: score a textcat pipeline on dev (and test, where it exists)."""

import json
from pathlib import Path

import typer

from . import app


@app.command("evaluate")
def evaluate_command(
    model_dir: Path = typer.Argument(
        ..., exists=True, file_okay=False, help="A trained pipeline, or a `tfidf` model"
    ),
    corpus_dir: Path = typer.Argument(
        ..., exists=True, file_okay=False, help="Holds dev.spacy (and test.spacy)"
    ),
    output: Path = typer.Argument(..., help="Metrics JSON; PNGs are written beside it"),
    name: str = typer.Option(..., help="Name of the run in tables and plots"),
    batch_size: int = typer.Option(128, help="nlp.pipe batch size for the timing"),
) -> None:
    """Accuracy, per-class P/R/F1, confusion matrix (text and PNG), λ/γ, words/s."""
    import spacy
    from spacy.tokens import DocBin

    from ..baselines.tfidf import TfidfClassifier
    from ..evaluate import (
        classification_report,
        evaluate_classifier,
        evaluate_textcat,
        mix_weights,
    )
    from ..plots import plot_confusion_matrix, plot_layer_weights

    tfidf = TfidfClassifier.is_saved_in(model_dir)
    if tfidf:
        classifier = TfidfClassifier.from_disk(model_dir)
        nlp = spacy.blank("en")
    else:
        nlp = spacy.load(model_dir)
    size = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
    result = {"name": name, "model": str(model_dir), "size_mb": size / 2**20, "splits": {}}
    stats_path = corpus_dir / "stats.json"
    if stats_path.is_file():
        result["data"] = json.loads(stats_path.read_text())
    time_path = model_dir.parent / "train_time.json"
    if time_path.is_file():
        result["train_seconds"] = json.loads(time_path.read_text())["seconds"]
    splits = ["dev", "test"]
    if not (corpus_dir / "test.spacy").is_file():
        typer.secho("No test split in the corpus: evaluating on dev only.", fg="yellow")
        splits = ["dev"]
    for split in splits:
        docs = list(DocBin().from_disk(corpus_dir / f"{split}.spacy").get_docs(nlp.vocab))
        if tfidf:
            labels = list(docs[0].cats)  # the corpus order, as in spaCy's textcat
            metrics = evaluate_classifier(docs, classifier.predict, labels)
        else:
            metrics = evaluate_textcat(nlp, docs, batch_size=batch_size)
        result["splits"][split] = metrics
        typer.echo(f"== {name} on {split} ==\n{classification_report(metrics)}\n")
        plot_confusion_matrix(
            metrics, output.with_name(f"{output.stem}_{split}_confusion.png"), f"{name} ({split})"
        )
    mix = None if tfidf else mix_weights(nlp)
    if mix is not None:
        result["mix"] = mix
        plot_layer_weights(
            mix["layer_weights"], mix["gamma"], output.with_name(f"{output.stem}_layers.png"), name
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    typer.echo(f"Metrics -> {output}")
