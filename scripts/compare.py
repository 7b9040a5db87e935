"""One markdown table of every evaluated run, and the section of docs/results.md that shows it."""

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SECTION_START = "<!-- comparison:start -->"
SECTION_END = "<!-- comparison:end -->"


def load_runs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The metrics of `evaluate` in each file, and in each *.json of each folder,
    best dev accuracy first."""
    runs = []
    for path in map(Path, paths):
        if not path.is_dir():
            runs.append(read_metrics(path))
            continue
        for file in sorted(path.glob("*.json")):
            metrics = read_metrics(file, other_tasks_ok=True)
            if metrics is not None:
                runs.append(metrics)
    if not runs:
        raise ValueError(f"No text classification metrics in {', '.join(map(str, paths))}")
    return sorted(runs, key=lambda r: -r["splits"]["dev"]["accuracy"])


def read_metrics(path: Path, other_tasks_ok: bool = False) -> dict[str, Any] | None:
    """The metrics that `python -m scripts evaluate` wrote to `path`. With
    other_tasks_ok, None for the metrics of other tasks (NER, tagging)."""
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path} is not a JSON file ({err}): evaluate the run again with "
            "`python -m scripts evaluate`, or leave the file out"
        ) from err
    is_textcat = isinstance(metrics, dict) and "accuracy" in metrics.get("splits", {}).get(
        "dev", {}
    )
    if is_textcat and "name" in metrics:
        return metrics
    if other_tasks_ok and isinstance(metrics, dict) and "dev" in metrics:
        return None
    raise ValueError(
        f"{path} holds no text classification metrics (name, splits.dev.accuracy): evaluate the "
        "run with `python -m scripts evaluate`, or leave the file out"
    )


def accuracy_by_name(runs: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Dev accuracies (%) per run name: runs that share a name are one model
    trained with several seeds."""
    by_name: dict[str, list[float]] = {}
    for run in runs:
        by_name.setdefault(run["name"], []).append(100 * run["splits"]["dev"]["accuracy"])
    return by_name


def data_statement(runs: list[dict[str, Any]]) -> str:
    data = next((r["data"] for r in runs if "data" in r), None)
    if data is None:
        return "Data: unknown (no corpus stats.json)."
    rows = data["train_rows_read"]
    which = (
        "the full official AG News train split"
        if rows == 120_000
        else f"a {rows:,}-row subset of the official AG News train split"
    )
    docs = data["docs"]
    test = (
        f"; test: the official test split ({docs['test']:,} docs)"
        if data.get("has_test")
        else "; the official test split was not available, so every figure is on dev"
    )
    return (
        f"Trained on {which}: {docs['train']:,} train docs and a stratified, seeded dev split of "
        f"{docs['dev']:,} docs ({data['dev_fraction']:.0%}){test}."
    )


def comparison_table(runs: list[dict[str, Any]]) -> str:
    labels = runs[0]["splits"]["dev"]["labels"]
    has_test = any("test" in r["splits"] for r in runs)
    has_branches = any("branch_accuracy" in r["splits"]["dev"] for r in runs)
    header = ["run", "dev acc", "dev macro-F1"] + [f"F1 {x}" for x in labels]
    header += ["dev acc, n-grams part alone", "dev acc, BiLSTM part alone"] if has_branches else []
    header += ["test acc"] if has_test else []
    header += ["train time", "words/s", "size on disk"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        dev = run["splits"]["dev"]
        cells = [run["name"], f"{dev['accuracy']:.2%}", f"{dev['macro_f1']:.2%}"]
        cells += [f"{dev['per_class'][x]['f1']:.2%}" for x in labels]
        if has_branches:
            parts = dev.get("branch_accuracy", {})
            cells += [
                f"{parts[k]:.2%}" if k in parts else "n/a" for k in ("linear_model", "bilstm")
            ]
        if has_test:
            test = run["splits"].get("test")
            cells.append(f"{test['accuracy']:.2%}" if test else "n/a")
        seconds = run.get("train_seconds")
        cells.append(f"{seconds / 60:.1f} min" if seconds else "n/a")
        cells.append(f"{dev['inference']['words_per_second']:,.0f}")
        size = run.get("size_mb")
        cells.append(f"{size:,.1f} MB" if size is not None else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def update_section(document: Path, section: str) -> None:
    """Replace the text between the comparison markers of `document`."""
    text = document.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(SECTION_START) + ".*?" + re.escape(SECTION_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{document} has no {SECTION_START} ... {SECTION_END} markers")
    document.write_text(
        pattern.sub(f"{SECTION_START}\n{section}\n{SECTION_END}", text), encoding="utf-8"
    )
