"""The pretraining curve as a PNG (matplotlib, optional: `pip install matplotlib`)."""

from pathlib import Path
from typing import Any


def plot_perplexity(log: dict[str, Any], path: Path) -> Path:
    """Dev perplexity per direction and the running train perplexity, per epoch,
    from the log that `pretrain` returns, written to `path`."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError("Plots need matplotlib: pip install matplotlib") from err
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    epochs = [e["epoch"] for e in log["epochs"]]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for key in ("forward", "backward", "mean"):
        ax.plot(
            epochs,
            [e["dev_perplexity"][key] for e in log["epochs"]],
            marker="o",
            label=f"dev {key}",
        )
    ax.plot(epochs, [e["train_perplexity"] for e in log["epochs"]], "--", label="train (running)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("perplexity")
    ax.set_yscale("log")
    ax.set_xticks(epochs)
    ax.legend()
    ax.set_title("biLM pretraining")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
