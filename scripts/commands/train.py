"""`python -m scripts train`: `spacy train`, timed, with the wall time written next to the model."""

import difflib
import inspect
import json
import time
from pathlib import Path
from typing import Any

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
    Extra options override the config, as for `spacy train`; unlike there, an
    override of a setting the config does not have is an error (a typo would
    otherwise train with the config's value)."""
    from spacy.cli._util import parse_config_overrides
    from spacy.cli.train import train

    overrides = parse_config_overrides(ctx.args)
    try:
        check_overrides(config_path, overrides)
    except ValueError as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(1) from err
    started = time.perf_counter()
    train(config_path, output_dir, use_gpu=gpu_id, overrides=overrides)
    seconds = time.perf_counter() - started
    (output_dir / "train_time.json").write_text(
        json.dumps({"config": str(config_path), "seconds": seconds}, indent=2) + "\n"
    )
    typer.echo(f"Trained in {seconds:.0f} s -> {output_dir}")


def check_overrides(config_path: Path, overrides: dict[str, Any]) -> None:
    """Refuse overrides of settings that neither `config_path` nor spaCy's
    defaults have (a setting in a block of a registered function or factory
    may also name one of its arguments), and a config that is not UTF-8."""
    from spacy.language import DEFAULT_CONFIG_PATH
    from spacy.util import load_config, load_config_from_str

    try:
        text = config_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{config_path} is not UTF-8 text ({err.reason}): save it as UTF-8"
        ) from err
    configs = [load_config_from_str(text), load_config(DEFAULT_CONFIG_PATH)]
    for name in overrides:
        *path, key = name.split(".")
        blocks = [_block(config, path) for config in configs]
        if any(block is not None and _accepts(block, key) for block in blocks):
            continue
        known = sorted(
            {k for block in blocks if block for k in block if not isinstance(block[k], dict)}
        )
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean --{'.'.join([*path, close[0]])}?" if close else ""
        raise ValueError(f"--{name} is not a setting of {config_path}{hint}")


def _block(config: dict, path: list[str]) -> dict | None:
    for part in path:
        config = config.get(part) if isinstance(config, dict) else None
    return config if isinstance(config, dict) else None


def _accepts(block: dict, key: str) -> bool:
    """Whether `key` is set in the block, or an argument of its function or factory."""
    from spacy.language import Language
    from spacy.util import registry

    if key in block:
        return True
    for field, value in block.items():
        if field.startswith("@"):
            function = registry.get(field[1:], value)
            return key in inspect.signature(function).parameters
    if "factory" in block and Language.has_factory(block["factory"]):
        return key in Language.get_factory_meta(block["factory"]).default_config
    return False
