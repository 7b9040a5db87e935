"""`python -m scripts train`: `spacy train`, timed, with the wall time written next to the model."""

import json
import time
from pathlib import Path

import typer

from . import app


@app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train_command(
    ctx: typer.Context,
    config_path: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="spaCy training config"
    ),
    output_dir: Path = typer.Argument(..., help="Where spaCy writes model-best/ and model-last/"),
    gpu_id: int = typer.Option(-1, help="GPU id, -1 for CPU"),
) -> None:
    """Run `spacy train` and record its wall time in OUTPUT_DIR/train_time.json.
    Extra options override the config, as for `spacy train`."""
    from spacy.cli._util import parse_config_overrides
    from spacy.cli.train import train

    started = time.perf_counter()
    train(config_path, output_dir, use_gpu=gpu_id, overrides=parse_config_overrides(ctx.args))
    seconds = time.perf_counter() - started
    (output_dir / "train_time.json").write_text(
        json.dumps({"config": str(config_path), "seconds": seconds}, indent=2) + "\n"
    )
    typer.echo(f"Trained in {seconds:.0f} s -> {output_dir}")
