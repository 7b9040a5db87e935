"""`elmo-spacy embed`: a corpus to ELMo vectors in HDF5, a DocBin, or Parquet
(`--engine ray`, on Ray actors: `elmo_spacy.ray_data`)."""

import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..bilm.formats.locate import layouts_help
from ..bilm.runner import RunSettings
from ..embedder import read_lines
from ..errors import ElmoSpacyError
from ..hdf5 import hdf5_keys, write_hdf5
from . import app, errors_to_exit, parse_part

if TYPE_CHECKING:
    from ..bilm.inputs.tokenization import Tokenization

FORMATS = ("hdf5", "spacy", "parquet")
ENGINES = ("local", "ray")
# The format each suffix names; each format's name, and its file's.
SUFFIXES = {".hdf5": "hdf5", ".h5": "hdf5", ".spacy": "spacy", ".parquet": "parquet"}
FORMAT_NAMES = {"hdf5": "HDF5", "spacy": "a DocBin", "parquet": "Parquet"}
FORMAT_FILES = {"hdf5": "an HDF5 file", "spacy": "a DocBin", "parquet": "a Parquet file"}


@app.command("embed")
def embed_command(
    bilm_path: Path = typer.Argument(
        ...,
        exists=True,
        help="A biLM: "
        + layouts_help()
        + ": then BILM_PATH is its options .json, and --weight-file its weights",
    ),
    input_file: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="UTF-8 text, one sentence per line"
    ),
    output_file: Path = typer.Argument(
        ...,
        dir_okay=False,
        help="The file to write: .hdf5 or .h5, .spacy (a DocBin), .parquet (--engine ray)",
    ),
    weight_file: Path = typer.Option(
        None,
        "--weight-file",
        help="The weights .hdf5 of the bilm-tf model whose options .json is BILM_PATH",
    ),
    all_layers: bool = typer.Option(
        False, "--all", help="Every layer: (L + 1, n, D) per line (the default)"
    ),
    top: bool = typer.Option(False, "--top", help="The top layer only: (n, D) per line"),
    average: bool = typer.Option(False, "--average", help="The mean of the layers: (n, D)"),
    layers: str = typer.Option(
        None, help="Keep these layers, e.g. 0,2 (0 = token encoding; --top takes the last kept)"
    ),
    state: str = typer.Option(
        RunSettings.state,
        help="LSTM state every sentence starts from: zero, or primed by a warm-up text",
    ),
    precision: str = typer.Option(
        RunSettings.precision,
        help="float32 (conformant), bfloat16, float16 or auto (the faster, timed)",
    ),
    warmup_file: Path = typer.Option(
        None,
        exists=True,
        dir_okay=False,
        help="Warm-up sentences of --state primed, one a line (default: shipped sentences)",
    ),
    tokenize: bool = typer.Option(
        False,
        help="Tokenise with spaCy's tokenizer instead of splitting on spaces",
    ),
    lang: str = typer.Option(
        None, help="Language of the spaCy tokenizer (with --tokenize; default: the biLM's, or en)"
    ),
    output_format: str = typer.Option(
        None,
        help="hdf5, spacy or parquet (--engine ray); default: what OUTPUT_FILE's suffix names, "
        "else the engine's",
    ),
    use_sentence_keys: bool = typer.Option(
        False, help="Key each dataset by its sentence, not its line index (AllenNLP's flag)"
    ),
    forget_sentences: bool = typer.Option(
        False, help="Write no sentence_to_index dataset (AllenNLP's flag)"
    ),
    part: str = typer.Option(
        None,
        metavar="K/N",
        help="Embed only lines i with i mod N = K (keys stay the line indices)",
    ),
    max_batch_tokens: int = typer.Option(
        RunSettings.max_batch_tokens, help="Padded tokens per biLM batch"
    ),
    gpu_id: int = typer.Option(-1, help="GPU to run on (-1: CPU)"),
    overwrite: bool = typer.Option(False, help="Replace OUTPUT_FILE if it exists"),
    engine: str = typer.Option(
        "local",
        help="local (this process) or ray (Ray actors: pip install elmo_spacy\\[ray])",
    ),
    actors: int = typer.Option(None, help="--engine ray: actors, each with its biLM [1]"),
    cpus_per_actor: float = typer.Option(
        None, help="--engine ray: CPUs per actor, which are its torch threads [1]"
    ),
    gpus_per_actor: float = typer.Option(
        None, help="--engine ray: GPUs per actor (1: each actor runs on a GPU of its own) [0]"
    ),
    lines_per_batch: int = typer.Option(
        None, help="--engine ray: lines per map_batches task [256]"
    ),
    ray_address: str = typer.Option(
        None,
        help="--engine ray: the cluster to join (auto: this machine's) [a local Ray]",
    ),
    dtype: str = typer.Option(
        "float32", help="--engine ray: float32, or float16 vectors in the Parquet file"
    ),
) -> None:
    """Embed a corpus, one sentence per line, into AllenNLP's HDF5 layout (a
    float32 dataset per line, keyed by its index, and `sentence_to_index`),
    a DocBin, or with --engine ray a Parquet file (docs/embedding.md)."""
    from tqdm import tqdm

    from ..bilm import load_bilm
    from ..bilm.runtime.devices import resolve_device
    from ..embedder import Embedder, shape_vectors, tokenizer_for
    from ..files import write_file

    with errors_to_exit():
        mode = _output_mode(all_layers, top, average)
        ray_options = {
            "--actors": actors,
            "--cpus-per-actor": cpus_per_actor,
            "--gpus-per-actor": gpus_per_actor,
            "--lines-per-batch": lines_per_batch,
            "--ray-address": ray_address,
        }
        _check_engine(engine, output_format, gpu_id, dtype, ray_options)
        output_format = _output_format(output_file, output_format, engine)
        bilm_source = bilm_path if weight_file is None else (bilm_path, weight_file)
        run = RunSettings(  # the options checked before any file is read
            layers=_parse_layers(layers),
            state=state,
            precision=precision,
            max_batch_tokens=max_batch_tokens,
        )
        _check_format(output_format, use_sentence_keys, forget_sentences)
        keep, of = parse_part(part)
        _check_output(output_file, overwrite)
        lines = read_lines(input_file)
        bilm = load_bilm(bilm_source, with_softmax=False)
        tokenization = _tokenization(tokenize, lang, bilm.tokenization)
        lang = tokenization.lang or lang or "en"
        tokenizer = tokenizer_for(tokenization)
        indices = [i for i in range(len(lines)) if i % of == keep]
        if warmup_file is not None:
            run = replace(run, warmup=tokenizer(read_lines(warmup_file)))
        if engine == "ray":
            from .. import ray_data
            from ..bilm.runner import resolve_layers

            resolve_layers(run.layers, bilm.config.n_layers + 1, "--layers")  # before Ray starts
            started = time.perf_counter()
            n_lines, n_tokens = ray_data.embed_to_parquet(
                bilm_source,
                lines,
                indices,
                output_file,
                embed_options={
                    "output": mode,
                    "dtype": dtype,
                    "run": run,
                    "tokenization": tokenization,
                },
                actors=actors or 1,
                cpus_per_actor=cpus_per_actor or 1,
                gpus_per_actor=gpus_per_actor or 0,
                lines_per_batch=lines_per_batch or 256,
                address=ray_address,
            )
        else:
            if output_format == "spacy":
                docs = _docs(tokenize, lang, [lines[i] for i in indices])
                sentences = [[t.text for t in doc] for doc in docs]
            else:
                sentences = tokenizer([lines[i] for i in indices])
                flag = "--use-sentence-keys"
                keys, index = hdf5_keys(lines, indices, use_sentence_keys, forget_sentences, flag)
            embedder = Embedder(bilm, run, device=resolve_device(gpu_id, "--gpu-id"))
            n_lines, n_tokens = len(sentences), sum(len(s) for s in sentences)
            started = time.perf_counter()
            with tqdm(
                total=n_tokens, unit="tok", unit_scale=True, desc="embed", leave=False
            ) as bar:
                embedded = embedder.embed_iter(sentences, progress=bar.update)
                vectors = ((i, shape_vectors(layers, mode)) for i, layers in embedded)
                if output_format == "spacy":
                    write_file(output_file, lambda path: write_docbin(path, docs, vectors))
                else:
                    write_file(output_file, lambda path: write_hdf5(path, keys, vectors, index))
    seconds = time.perf_counter() - started
    typer.echo(
        f"{n_lines} lines, {n_tokens} tokens in {seconds:.1f} s "
        f"({n_tokens / max(seconds, 1e-9):,.0f} tokens/s) -> {output_file}"
    )


def write_docbin(path: Path, docs: list, vectors: Iterable[tuple]) -> None:
    """A DocBin of the docs, in line order, each with doc._.elmo set to its
    (position, vectors) pair's ((1, n, D) with --top or --average)."""
    from spacy.tokens import DocBin

    from ..extensions import set_layers

    for position, output in vectors:
        set_layers(docs[position], output if output.ndim == 3 else output[None])
    DocBin(store_user_data=True, docs=docs).to_disk(path)


def _output_mode(all_layers: bool, top: bool, average: bool) -> str:
    flags = {"all": all_layers, "top": top, "average": average}
    chosen = [name for name, flag in flags.items() if flag]
    if len(chosen) > 1:
        raise ElmoSpacyError(f"--{' and --'.join(chosen)}: choose one of --all, --top, --average")
    return chosen[0] if chosen else "all"


def _check_format(output_format: str, use_sentence_keys: bool, forget_sentences: bool) -> None:
    if output_format != "hdf5" and (use_sentence_keys or forget_sentences):
        what = "a DocBin" if output_format == "spacy" else "the Parquet file"
        raise ElmoSpacyError(
            f"--use-sentence-keys and --forget-sentences shape HDF5 output: {what} keeps the "
            "lines in line order, with their text"
        )


def _check_engine(
    engine: str, output_format: str | None, gpu_id: int, dtype: str, ray_options: dict
) -> None:
    """Refuse the options that do not apply to `engine`."""
    if engine not in ENGINES:
        raise ElmoSpacyError(f"--engine {engine}: use one of {', '.join(ENGINES)}")
    if dtype not in ("float32", "float16"):
        raise ElmoSpacyError(f"--dtype {dtype}: use float32 or float16")
    if engine == "local":
        given = [name for name, value in ray_options.items() if value is not None]
        if dtype != "float32":
            given.append(f"--dtype {dtype}")
        if given:
            raise ElmoSpacyError(
                f"{', '.join(given)}: for --engine ray only (HDF5 and DocBin output are "
                "float32): add --engine ray, or drop them"
            )
        if output_format == "parquet":
            raise ElmoSpacyError("--output-format parquet is --engine ray's: add --engine ray")
        return
    if output_format not in (None, "parquet"):
        raise ElmoSpacyError(
            f"--engine ray writes Parquet, not {output_format}: drop --output-format (or give "
            "parquet), or use --engine local for HDF5 and DocBin output"
        )
    if gpu_id != -1:
        raise ElmoSpacyError(
            "--gpu-id picks a GPU of this process: with --engine ray give --gpus-per-actor 1, "
            "and Ray gives each actor a GPU of its own"
        )
    for name in ("--actors", "--cpus-per-actor", "--lines-per-batch"):
        if ray_options[name] is not None and ray_options[name] <= 0:
            raise ElmoSpacyError(f"{name} {ray_options[name]}: give a number above 0")
    if (ray_options["--gpus-per-actor"] or 0) < 0:
        raise ElmoSpacyError(f"--gpus-per-actor {ray_options['--gpus-per-actor']}: give 0 or more")


def _output_format(output_file: Path, output_format: str | None, engine: str) -> str:
    """The format to write: --output-format, else the one OUTPUT_FILE's
    suffix names (`SUFFIXES`), else the engine's (hdf5 for local, parquet for
    ray). A suffix that names another format than the one chosen, or one
    the engine does not write, is refused, so that no file holds what its
    name does not say."""
    if output_format is not None and output_format not in FORMATS:
        raise ElmoSpacyError(f"--output-format {output_format}: use one of {', '.join(FORMATS)}")
    suffix = output_file.suffix
    named = SUFFIXES.get(suffix.lower())
    if named is None:
        return output_format or ("parquet" if engine == "ray" else "hdf5")
    if engine == "ray" and named != "parquet":
        raise ElmoSpacyError(
            f"{output_file} names {FORMAT_FILES[named]} ({suffix}), but --engine ray writes "
            f"Parquet: name it {output_file.with_suffix('.parquet')}, or use --engine local to "
            f"write {FORMAT_NAMES[named]}"
        )
    if engine == "local" and named == "parquet":
        raise ElmoSpacyError(
            f"{output_file} names a Parquet file, which --engine ray writes: add --engine ray, "
            f"or name it {output_file.with_suffix('.hdf5')} (HDF5) or "
            f"{output_file.with_suffix('.spacy')} (a DocBin)"
        )
    if output_format is not None and output_format != named:
        wanted = next(s for s, f in SUFFIXES.items() if f == output_format)
        raise ElmoSpacyError(
            f"--output-format {output_format} writes {FORMAT_NAMES[output_format]}, but "
            f"{output_file} names {FORMAT_FILES[named]} ({suffix}): name it "
            f"{output_file.with_suffix(wanted)}, or drop --output-format to write "
            f"{FORMAT_NAMES[named]}"
        )
    return named


def _parse_layers(layers: str | None) -> list[int] | None:
    if layers is None:
        return None
    try:
        return [int(part) for part in layers.split(",")]
    except ValueError:
        raise ElmoSpacyError(
            f"--layers {layers}: give layer indices separated by commas, e.g. --layers 1,2"
        ) from None


def _check_output(output_file: Path, overwrite: bool) -> None:
    if output_file.exists() and not overwrite:
        raise FileExistsError(f"{output_file} exists: pass --overwrite to replace it")
    if not output_file.parent.is_dir():
        raise FileNotFoundError(f"The folder of {output_file} does not exist: create it first")


def _tokenization(tokenize: bool, lang: str | None, recorded) -> "Tokenization":
    """How the lines are cut: spaCy's tokenizer (--tokenize; --lang, or the
    language the biLM records, or English) or white space. Says so on stderr
    where that is not how the biLM's own text was cut."""
    from ..bilm.inputs.tokenization import WHITESPACE, Tokenization

    spacy_biLM = recorded is not None and recorded.tokenizer == "spacy"
    if not tokenize:
        if spacy_biLM:
            message = (
                f"The biLM learned {recorded}; the lines are split on white space. Pass "
                "--tokenize to cut them as its text was cut."
            )
            typer.secho(message, fg="yellow", err=True)
        return WHITESPACE
    chosen = Tokenization("spacy", lang or (recorded.lang if spacy_biLM else "en"))
    if recorded is not None and recorded != chosen:
        message = f"The biLM learned {recorded}; the lines are cut by {chosen}."
        typer.secho(message, fg="yellow", err=True)
    return chosen


def _docs(tokenize: bool, lang: str, lines: list[str]) -> list:
    """The docs of the DocBin: spaCy's tokenisation of each line, or a doc of
    its space-separated tokens."""
    from spacy.tokens import Doc

    from ..tokenizer import blank

    nlp = blank(lang, f"--lang {lang}")
    if tokenize:
        return list(nlp.tokenizer.pipe(lines))
    return [Doc(nlp.vocab, words=line.split()) for line in lines]
