"""PNG plots of the study: confusion matrix, layer weights, accuracy per run."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or an ImportError that says what to install."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError("Plots need matplotlib: pip install matplotlib") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Write `fig` to `path` (parent folders created) and free it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_confusion_matrix(metrics: dict[str, Any], path: Path, title: str) -> Path:
    plt = pyplot()
    labels, matrix = metrics["labels"], metrics["confusion_matrix"]
    fig, ax = plt.subplots(figsize=(5.5, 4.8))
    image = ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(f"{title}\naccuracy {metrics['accuracy']:.2%}, n = {metrics['n_docs']}")
    top = max(max(row) for row in matrix) or 1
    for i, row in enumerate(matrix):
        for j, n in enumerate(row):
            ax.text(
                j, i, str(n), ha="center", va="center", color="white" if n > top / 2 else "black"
            )
    fig.colorbar(image, ax=ax, fraction=0.046)
    return save_figure(fig, path)


def plot_layer_weights(weights: Sequence[float], gamma: float, path: Path, title: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    names = ["token encoding"] + [f"LSTM {i}" for i in range(1, len(weights))]
    ax.bar(names, weights, color="tab:blue")
    ax.set_ylim(0, 1)
    ax.set_ylabel("softmax(λ)")
    ax.set_title(f"{title} (γ = {gamma:.2f})")
    for i, w in enumerate(weights):
        ax.text(i, w + 0.02, f"{w:.2f}", ha="center")
    return save_figure(fig, path)


def plot_accuracy(by_name: dict[str, list[float]], path: Path, title: str) -> Path:
    """Dev accuracy (%) of each named run as a horizontal bar: at the mean of
    its seeds, with a line from the lowest to the highest where there are several."""
    plt = pyplot()
    names = sorted(by_name, key=lambda name: sum(by_name[name]) / len(by_name[name]))
    means = [sum(by_name[n]) / len(by_name[n]) for n in names]
    spread = [[m - min(by_name[n]) for n, m in zip(names, means)]]
    spread.append([max(by_name[n]) - m for n, m in zip(names, means)])
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(names) + 1.2))
    several = any(len(v) > 1 for v in by_name.values())
    ax.barh(names, means, xerr=spread if several else None, color="tab:blue", capsize=3)
    low = min(min(v) for v in by_name.values())
    ax.set_xlim(max(0, low - 3), min(100, max(means) + 5))
    for i, m in enumerate(means):
        runs_here = len(by_name[names[i]])
        seeds = f" ({runs_here} seeds)" if runs_here > 1 else ""
        ax.text(m + 0.3, i, f"{m:.2f}{seeds}", va="center")
    ax.set_xlabel("dev accuracy (%)")
    ax.set_title(title)
    return save_figure(fig, path)


def plot_pos_confusion(
    confusion: dict[str, dict[str, int]], path: Path, title: str, k: int = 8
) -> Path:
    """The k UPOS tags most often in errors: the share of each gold tag's
    tokens (row) predicted as each other tag (column); the diagonal is left blank."""
    from .token_evaluate import most_confused

    plt = pyplot()
    tags = sorted(most_confused(confusion, k))
    rows = []
    for gold in tags:
        total = sum(confusion.get(gold, {}).values()) or 1
        row = confusion.get(gold, {})
        rows.append([row.get(p, 0) / total if p != gold else 0.0 for p in tags])
    fig, ax = plt.subplots(figsize=(6.0, 5.2))
    image = ax.imshow(rows, cmap="Reds", vmin=0, vmax=max(max(r) for r in rows) or 1)
    ax.set_xticks(range(len(tags)), tags, rotation=45, ha="right")
    ax.set_yticks(range(len(tags)), tags)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(
        f"{title}\nthe {len(tags)} UPOS tags most often confused (errors, share of gold row)"
    )
    for i, row in enumerate(rows):
        for j, share in enumerate(row):
            ax.text(
                j, i, f"{share:.2f}" if share >= 0.005 else "", ha="center", va="center", fontsize=7
            )
    fig.colorbar(image, ax=ax, fraction=0.046)
    return save_figure(fig, path)
