"""`elmo-spacy pretrain`: tokenise a text file with spaCy and pretrain a biLM on it."""

from pathlib import Path

import typer
from spacy.cli._util import parse_config_overrides

from . import app, errors_to_exit


@app.command(
    "pretrain", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def pretrain_command(
    ctx: typer.Context,
    config_path: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="Pretraining config (.cfg)"
    ),
    text_path: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="Text: .txt (a doc per line) or .jsonl"
    ),
    output_dir: Path = typer.Argument(
        ..., help="Writes model-best/, model-last/ and pretrain_log.json"
    ),
    lang: str = typer.Option("en", help="Language of the spaCy tokenizer"),
    resume: bool = typer.Option(False, help="Go on from the latest checkpoint in OUTPUT_DIR"),
    init_vectors: Path = typer.Option(
        None,
        exists=True,
        file_okay=False,
        help="Start the word embeddings from these vectors (a spaCy pipeline with vectors, "
        "e.g. from `spacy init vectors`); word encoder only",
    ),
    gpu_id: int = typer.Option(
        -1, help="GPU to train on (-1: CPU). Under torchrun, >= 0 puts rank r on GPU LOCAL_RANK"
    ),
) -> None:
    """Pretrain a biLM. Extra options override the config, e.g. --training.max_epochs 1.
    Data-parallel on N processes: torchrun --nproc_per_node N --no-python elmo-spacy pretrain ..."""
    from ..pretrain import load_pretrain_config, pretrain, start_workers, stop_workers
    from ..pretrain.texts import read_tokenised_texts

    with errors_to_exit():
        bilm_config, training = load_pretrain_config(config_path, parse_config_overrides(ctx.args))
        workers = start_workers(gpu_id)
        docs = read_tokenised_texts(text_path, lang)
        vectors = None
        if init_vectors is not None:
            import spacy

            table = spacy.load(init_vectors).vocab.vectors
            vectors = {table.strings[key]: table.data[row] for key, row in table.key2row.items()}
        log = pretrain(
            docs,
            bilm_config,
            training,
            output_dir,
            resume=resume,
            init_vectors=vectors,
            workers=workers,
        )
    stop_workers(workers)
    if not workers.is_main:
        return
    try:
        from ..pretrain.plots import plot_perplexity

        plot_perplexity(log, output_dir / "perplexity.png")
    except ImportError as err:
        typer.secho(f"No perplexity plot: {err}", fg="yellow")
    typer.echo(
        f"Best dev perplexity {log['best_dev_perplexity']:.2f} after {len(log['epochs'])} "
        f"epoch(s), {log['wall_seconds']:.0f} s. biLM: {output_dir / 'model-best'}"
    )
