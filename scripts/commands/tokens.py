"""`python -m scripts ner-corpus / tag-corpus / evaluate-tokens / compare-tokens`:
the token-level workflows (CoNLL-2003 NER, UD English EWT tagging)."""

import json
from pathlib import Path

import typer

from . import app


def _corpus(
    task: str, source_dir: Path, output_dir: Path, pretrain_text: Path | None, verify: bool
):
    from ..token_corpus import build_token_corpus

    try:
        stats = build_token_corpus(task, source_dir, output_dir, pretrain_text, verify, typer.echo)
    except (OSError, ValueError) as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(1) from err
    splits = ", ".join(
        f"{s} {stats[s]['docs']:,} docs" for s in ("train", "dev", "test") if s in stats
    )
    typer.echo(f"{splits}; {stats['pretrain_texts']:,} pretraining texts -> {output_dir}")


@app.command("ner-corpus")
def ner_corpus_command(
    source_dir: Path = typer.Argument(
        ..., help="Folder with eng.train and eng.testa (and eng.testb)"
    ),
    output_dir: Path = typer.Argument(
        ..., help="Writes train/dev(/test).spacy, pretrain.txt, stats.json"
    ),
    pretrain_text: Path = typer.Option(
        None, help="Text to pretrain on before the train texts (AG News)"
    ),
    verify: bool = typer.Option(True, help="Check the files against their known md5"),
) -> None:
    """CoNLL-2003 -> DocBins with entities (a Doc a document, sentences marked)."""
    _corpus("ner", source_dir, output_dir, pretrain_text, verify)


@app.command("tag-corpus")
def tag_corpus_command(
    source_dir: Path = typer.Argument(..., help="Folder with en_ewt-ud-{train,dev}(,-test).conllu"),
    output_dir: Path = typer.Argument(
        ..., help="Writes train/dev(/test).spacy, pretrain.txt, stats.json"
    ),
    pretrain_text: Path = typer.Option(
        None, help="Text to pretrain on before the train texts (AG News)"
    ),
    verify: bool = typer.Option(True, help="Check the files against their known md5"),
) -> None:
    """UD English EWT (CoNLL-U) -> DocBins with UPOS and XPOS (ten sentences a Doc)."""
    _corpus("tag", source_dir, output_dir, pretrain_text, verify)


@app.command("evaluate-tokens")
def evaluate_tokens_command(
    model_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="A trained pipeline"),
    corpus_dir: Path = typer.Argument(
        ..., exists=True, file_okay=False, help="Holds dev.spacy (and test.spacy)"
    ),
    output: Path = typer.Argument(
        ..., help="Metrics JSON (metrics/ner_<run>.json or tag_<run>.json)"
    ),
    name: str = typer.Option(..., help="Name of the run in tables"),
) -> None:
    """spaCy's scores on dev (and test, where it exists), words/s, train time;
    for tagging a picture of the most confused UPOS tags."""
    import spacy
    from spacy.tokens import DocBin

    from ..plots import plot_pos_confusion
    from ..token_evaluate import evaluate_tokens, most_confused

    nlp = spacy.load(model_dir)
    result: dict = {"name": name, "model": str(model_dir)}
    time_path = model_dir.parent / "train_time.json"
    if time_path.is_file():
        result["train_seconds"] = json.loads(time_path.read_text())["seconds"]
    splits = ["dev"] + (["test"] if (corpus_dir / "test.spacy").is_file() else [])
    if splits == ["dev"]:
        typer.secho("No test split in the corpus: evaluating on dev only.", fg="yellow")
    for split in splits:
        gold = list(DocBin().from_disk(corpus_dir / f"{split}.spacy").get_docs(nlp.vocab))
        metrics = evaluate_tokens(nlp, gold)
        result[split] = metrics
        shown = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
        typer.echo(f"== {name} on {split} ==\n{json.dumps(shown, indent=2)}")
        confusion = metrics.get("pos_confusion")
        if confusion is not None and most_confused(confusion):
            picture = output.with_name(f"{output.stem}_{split}_pos_confusion.png")
            plot_pos_confusion(confusion, picture, f"{name} ({split})")
        elif confusion is not None:
            typer.echo(f"No UPOS errors on {split}: no confusion picture.")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    typer.echo(f"Metrics -> {output}")


@app.command("compare-tokens")
def compare_tokens_command(
    metrics: list[Path] = typer.Argument(
        ..., exists=True, dir_okay=False, help="evaluate-tokens JSON files"
    ),
    output: Path = typer.Option(..., help="Markdown file to write"),
) -> None:
    """One table of NER (F1 overall and per type) or tagging (UPOS, XPOS) runs."""
    from ..token_evaluate import ner_table, tag_table

    runs = []
    for path in metrics:
        try:
            runs.append(json.loads(path.read_text(encoding="utf-8")))
        except ValueError as err:
            typer.secho(
                f"{path} is not a JSON file ({err}): run evaluate-tokens again", fg="red", err=True
            )
            raise typer.Exit(1) from err
    is_ner = all("ents_f" in run["dev"] for run in runs)
    table = ner_table(runs) if is_ner else tag_table(runs)
    split = "test" if any("test" in run for run in runs) else "dev"
    note = (
        "" if split == "test" else "The test split was not available: every figure is on dev.\n\n"
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(note + table + "\n", encoding="utf-8")
    typer.echo(note + table)
