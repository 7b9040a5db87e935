"""`elmo-spacy compare`: one markdown table of all evaluated runs."""

from pathlib import Path

import typer

from . import app


@app.command("compare")
def compare_command(
    metrics: list[Path] = typer.Argument(
        ..., exists=True, dir_okay=False, help="Metrics JSON files from `evaluate`"
    ),
    output: Path = typer.Option(..., help="Markdown file to write"),
    readme: Path = typer.Option(None, help="Also replace the comparison section of this README"),
) -> None:
    """Accuracy, macro-F1, per-class F1, train time and words/s of every run."""
    from ..compare import comparison_table, data_statement, load_runs, update_readme

    runs = load_runs(metrics)
    section = f"{data_statement(runs)}\n\n{comparison_table(runs)}"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(section + "\n", encoding="utf-8")
    if readme is not None:
        update_readme(readme, section)
    typer.echo(section)
