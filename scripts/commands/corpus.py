"""`python -m scripts corpus`: AG News CSV files -> DocBins and pretraining text."""

from pathlib import Path

import typer

from . import app


@app.command("corpus")
def corpus_command(
    source_dir: Path = typer.Argument(
        ..., exists=True, file_okay=False, help="Folder with train.csv (and test.csv, classes.txt)"
    ),
    output_dir: Path = typer.Argument(
        ..., help="Writes train/dev/test.spacy, pretrain.txt, stats.json"
    ),
    unlabeled: Path | None = typer.Option(
        None, help="Extra unlabeled texts for pretraining (a doc per line)"
    ),
    dev_fraction: float = typer.Option(0.05, help="Share of each class held out as dev"),
    seed: int = typer.Option(0, help="Seed of the dev split"),
    skip_bad_rows: bool = typer.Option(
        False, help="Skip bad rows (and count them) instead of stopping"
    ),
    limit: int = typer.Option(0, help="Keep only the first N train rows (0 = all)"),
    verify: bool = typer.Option(
        True, help="Check train.csv and test.csv against the known AG News checksums"
    ),
    lang: str = typer.Option("en", help="Language of the spaCy tokenizer"),
) -> None:
    """Convert AG News CSV files into the project's corpus."""
    import spacy

    from ..agnews import CLASS_NAMES, BadRowError, ChecksumError, check_known_file
    from ..agnews_corpus import build_corpus

    train_csv = source_dir / "train.csv"
    if not train_csv.is_file():
        typer.secho(
            f"{train_csv} is missing. Download AG News with `spacy project assets`, "
            "or point to a folder that holds train.csv (--vars.data_dir in the project, "
            "$AG_NEWS_DIR for `make all`).",
            fg="red",
            err=True,
        )
        raise typer.Exit(1)
    test_csv = source_dir / "test.csv"
    if not test_csv.is_file():
        typer.secho(
            f"No test split: {test_csv} does not exist. Writing train and dev only; "
            "evaluate on dev.",
            fg="yellow",
        )
        test_csv = None
    if verify:
        try:
            for path in filter(None, (train_csv, test_csv)):
                typer.echo(f"{path.name}: {check_known_file(path)}")
        except ChecksumError as err:
            typer.secho(str(err), fg="red", err=True)
            raise typer.Exit(1) from err
    classes_txt = source_dir / "classes.txt"
    class_names = (
        tuple(
            line.strip()
            for line in classes_txt.read_text(encoding="utf-8").splitlines()
            if line.strip()
        )
        if classes_txt.is_file()
        else CLASS_NAMES
    )
    if unlabeled is not None and not unlabeled.is_file():
        typer.secho(
            f"No unlabeled texts at {unlabeled}: pretraining on train texts only.", fg="yellow"
        )
        unlabeled = None
    try:
        stats = build_corpus(
            spacy.blank(lang),
            train_csv,
            output_dir,
            test_csv=test_csv,
            unlabeled=unlabeled,
            class_names=class_names,
            dev_fraction=dev_fraction,
            seed=seed,
            skip_bad_rows=skip_bad_rows,
            limit=limit,
        )
    except BadRowError as err:
        typer.secho(
            f"{err}\nFix the row, or pass --skip-bad-rows to skip such rows.", fg="red", err=True
        )
        raise typer.Exit(1) from err
    except ValueError as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(1) from err
    for name, skipped in stats["skipped_rows"].items():
        if skipped:
            typer.secho(
                f"Skipped {len(skipped)} bad row(s) of {name}, e.g. {skipped[0]}", fg="yellow"
            )
    typer.echo(
        f"Docs: {stats['docs']}; pretraining texts: {stats['pretrain_texts']} -> {output_dir}"
    )
