"""`elmo-spacy prepare`: text tokenised once into a corpus that pretraining streams from."""

import re
import time
from pathlib import Path

import typer

from ..errors import ElmoSpacyError
from . import app, errors_to_exit, parse_part

SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


@app.command("prepare")
def prepare_command(
    inputs: list[str] = typer.Argument(
        None,
        metavar="TEXT...",
        help='Text files (.txt: a doc per line; .jsonl: a "text" a line; either .gz), '
        "folders of them, or glob patterns",
        show_default=False,
    ),
    output_dir: Path = typer.Argument(..., metavar="OUTPUT_DIR", help="The prepared corpus"),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Check prepared folders (every argument) against their manifests' checksums "
        "instead, e.g. after copying them between machines",
    ),
    lang: str = typer.Option("en", help="Language of spaCy's tokenizer"),
    pretokenized: bool = typer.Option(False, "--pretokenized", help="Split on white space instead"),
    n_process: int = typer.Option(1, help="Processes that tokenise"),
    part: str = typer.Option(
        None,
        metavar="K/N",
        help="Prepare the K-th of N parts (K from 0), each into its own OUTPUT_DIR: "
        "pretraining reads the N folders as one corpus",
    ),
    shard_size: str = typer.Option(
        "100M", help="Characters of text a shard, e.g. 100M, 500k (the unit of resuming)"
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace a preparation of other inputs in OUTPUT_DIR"
    ),
) -> None:
    """Tokenise text once and write it as a prepared corpus that `elmo-spacy
    pretrain` streams from. A killed or interrupted preparation goes on from
    its last finished shard when the same command runs again."""
    from ..pretrain import Corpus, prepare_corpus

    if verify:
        verify_folders([*(inputs or []), str(output_dir)])
        return
    if not inputs:
        raise typer.BadParameter("give TEXT... OUTPUT_DIR", param_hint="TEXT...")
    with errors_to_exit():
        started = time.perf_counter()
        prepare_corpus(
            inputs,
            output_dir,
            lang=lang,
            pretokenized=pretokenized,
            n_process=n_process,
            part=parse_part(part),
            shard_size=parse_size(shard_size),
            overwrite=overwrite,
        )
        corpus = Corpus.open([output_dir])
        seconds = time.perf_counter() - started
    folder = corpus.folders[0]
    typer.echo(
        f"{output_dir}: {corpus.n_docs:,} docs, {corpus.n_tokens:,} tokens, "
        f"{len(corpus.types):,} distinct, in {len(corpus.shards)} shard(s) "
        f"({corpus.tokenization}); {seconds:.0f} s. Next: elmo-spacy pretrain CONFIG "
        f"{output_dir}{' ...' if folder.manifest['part'][1] > 1 else ''} OUTPUT_DIR"
    )


def verify_folders(paths: list[str]) -> None:
    """Check each prepared folder against its manifest, naming the first damaged file."""
    from tqdm import tqdm

    from ..pretrain import Corpus

    with errors_to_exit():
        for path in paths:
            corpus = Corpus.open([path])
            with tqdm(total=corpus.n_bytes, unit="B", unit_scale=True, desc=path) as bar:
                corpus.verify(bar.update)
            typer.echo(f"{path}: every file as its manifest says")


def parse_size(size: str) -> int:
    """ "100M" -> 100_000_000; "500k", "2G", "1000" alike."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", size)
    if not match:
        raise ElmoSpacyError(f"--shard-size {size}: give a number of characters, e.g. 100M or 500k")
    return max(1, int(float(match[1]) * SIZE_UNITS[match[2].lower()]))
