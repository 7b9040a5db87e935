"""`python -m scripts compare`: one markdown table of all evaluated runs."""

from pathlib import Path

import typer

from . import app


@app.command("compare")
def compare_command(
    metrics: list[Path] = typer.Argument(
        ..., exists=True, help="Metrics JSON files from `evaluate`, or folders of them"
    ),
    output: Path = typer.Option(..., help="Markdown file to write"),
    document: Path = typer.Option(
        None, help="Also replace the comparison section of this file (docs/results.md)"
    ),
    chart: Path = typer.Option(None, help="Also draw a bar chart of dev accuracy (PNG)"),
) -> None:
    """Accuracy, macro-F1, per-class F1, train time, words/s and size on disk of every run."""
    from ..compare import (
        accuracy_by_name,
        comparison_table,
        data_statement,
        load_runs,
        update_section,
    )

    try:
        runs = load_runs(metrics)
    except ValueError as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(1) from err
    if chart is not None:
        from ..plots import plot_accuracy

        plot_accuracy(accuracy_by_name(runs), chart, "AG News, dev split")
    section = f"{data_statement(runs)}\n\n{comparison_table(runs)}"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(section + "\n", encoding="utf-8")
    if document is not None:
        update_section(document, section)
    typer.echo(section)
