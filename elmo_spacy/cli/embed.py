"""`elmo-spacy embed`: a corpus, one sentence per line, to ELMo vectors in
HDF5 (the layout of AllenNLP's `allennlp elmo`) or in a DocBin."""

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..bilm.formats.locate import layouts_help
from ..bilm.runner import RUN_DEFAULTS
from ..errors import ElmoSpacyError
from . import app, deprecated_part, errors_to_exit, parse_part

if TYPE_CHECKING:
    from ..bilm.inputs.tokenization import Tokenization

FORMATS = ("hdf5", "spacy")


@app.command("embed")
def embed_command(
    bilm_path: Path = typer.Argument(
        ...,
        exists=True,
        help="A biLM: " + layouts_help(),
    ),
    input_file: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="UTF-8 text, one sentence per line"
    ),
    output_file: Path = typer.Argument(..., dir_okay=False, help="The HDF5 (or .spacy) to write"),
    all_layers: bool = typer.Option(
        False, "--all", help="Every layer: (L + 1, n, D) per line (the default)"
    ),
    top: bool = typer.Option(False, "--top", help="The top layer only: (n, D) per line"),
    average: bool = typer.Option(False, "--average", help="The mean of the layers: (n, D)"),
    layers: str = typer.Option(
        None, help="Keep these layers, e.g. 0,2 (0 = token encoding; --top takes the last kept)"
    ),
    state: str = typer.Option(
        RUN_DEFAULTS.state,
        help="LSTM state every sentence starts from: zero, or primed by a warm-up text",
    ),
    precision: str = typer.Option(
        RUN_DEFAULTS.precision,
        help="float32 (conformant), bfloat16 (faster on CPUs with bfloat16 units and on GPUs) "
        "or float16 (GPUs without bfloat16)",
    ),
    warmup_file: Path = typer.Option(
        None,
        exists=True,
        dir_okay=False,
        help="Warm-up sentences of --state primed, one a line (default: shipped sentences)",
    ),
    tokenize: bool = typer.Option(
        False,
        help="Tokenise with spaCy's tokenizer instead of splitting on spaces (for a biLM "
        "pretrained on spaCy's tokens: the language it records)",
    ),
    lang: str = typer.Option(
        None, help="Language of the spaCy tokenizer (with --tokenize; default: the biLM's, or en)"
    ),
    output_format: str = typer.Option(
        "hdf5", help="hdf5 (AllenNLP's layout), or spacy (a DocBin with doc._.elmo set)"
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
    shard: str = typer.Option(None, metavar="K/N", hidden=True, help="Deprecated: --part"),
    max_batch_tokens: int = typer.Option(
        RUN_DEFAULTS.max_batch_tokens, help="Padded tokens per biLM batch"
    ),
    gpu_id: int = typer.Option(-1, help="GPU to run on (-1: CPU)"),
    overwrite: bool = typer.Option(False, help="Replace OUTPUT_FILE if it exists"),
) -> None:
    """Embed a corpus with a biLM: one sentence per line, tokens separated by
    spaces (or --tokenize), written as AllenNLP's `allennlp elmo` writes it:
    a float32 dataset per line, keyed by the line's index ("0", "1", ...),
    and a `sentence_to_index` dataset (JSON: sentence -> key). An empty line
    gives an empty dataset. The file appears only once it is complete."""
    from ..bilm import load_bilm
    from ..bilm.runner import RunSettings
    from ..bilm.runtime.devices import resolve_device
    from ..embedder import Embedder, tokenizer_for
    from ..files import write_file

    with errors_to_exit():
        mode = _output_mode(all_layers, top, average)
        settings = RunSettings(  # the options checked before any file is read
            layers=_parse_layers(layers),
            state=state,
            precision=precision,
            max_batch_tokens=max_batch_tokens,
            origin="--",
        )
        _check_format(output_format, use_sentence_keys, forget_sentences)
        keep, of = parse_part(deprecated_part(part, shard))
        _check_output(output_file, overwrite)
        lines = read_lines(input_file)
        bilm = load_bilm(bilm_path, with_softmax=False)
        tokenization = _tokenization(tokenize, lang, bilm.tokenization)
        lang = tokenization.lang or lang or "en"
        tokenizer = tokenizer_for(tokenization)
        indices = [i for i in range(len(lines)) if i % of == keep]
        if output_format == "spacy":
            docs = _docs(tokenize, lang, [lines[i] for i in indices])
            sentences = [[t.text for t in doc] for doc in docs]
        else:
            sentences = tokenizer([lines[i] for i in indices])
        if use_sentence_keys:
            _check_sentence_keys(lines, indices)
        warmup = None if warmup_file is None else tokenizer(read_lines(warmup_file))
        embedder = Embedder(
            bilm,
            layers=settings.layers,
            state=settings.state,
            warmup=warmup,
            max_batch_tokens=settings.max_batch_tokens,
            device=resolve_device(gpu_id, "--gpu-id"),
            precision=settings.precision,
        )
        started = time.perf_counter()
        vectors = _embedded(embedder, sentences, mode)
        if output_format == "spacy":
            write_file(output_file, lambda path: write_docbin(path, docs, vectors))
        else:
            keys = [lines[i] if use_sentence_keys else str(i) for i in indices]
            index = (
                None
                if use_sentence_keys or forget_sentences
                else _sentence_to_index(lines, indices)
            )
            write_file(output_file, lambda path: write_hdf5(path, keys, vectors, index))
    seconds = time.perf_counter() - started
    n_tokens = sum(len(s) for s in sentences)
    typer.echo(
        f"{len(sentences)} lines, {n_tokens} tokens in {seconds:.1f} s "
        f"({n_tokens / max(seconds, 1e-9):,.0f} tokens/s) -> {output_file}"
    )


def read_lines(path: Path) -> list[str]:
    """The file's lines, stripped of surrounding white space (as AllenNLP
    reads them); an empty line stays, as an empty sentence."""
    try:
        with open(path, encoding="utf-8") as file:
            return [line.strip() for line in file]
    except UnicodeDecodeError as err:
        raise ElmoSpacyError(f"{path} is not UTF-8 text ({err}): convert it to UTF-8") from err


def _embedded(embedder, sentences: list[list[str]], mode: str):
    """A function that yields (position, float32 array) for every sentence,
    shaped by `mode`, with a progress bar in tokens/s."""
    import numpy
    from tqdm import tqdm

    def shaped(layers: numpy.ndarray) -> numpy.ndarray:
        if mode == "top":
            return layers[-1]
        if mode == "average":
            return layers.mean(axis=0)  # numpy.average (AllenNLP's) fails on 0 tokens
        return layers

    def vectors():
        total = sum(len(s) for s in sentences)
        with tqdm(total=total, unit="tok", unit_scale=True, desc="embed", leave=False) as bar:
            for position, layers in embedder.embed_iter(sentences, progress=bar.update):
                yield position, shaped(layers)

    return vectors


def write_hdf5(
    path: Path,
    keys: Sequence[str],
    vectors: Callable,
    sentence_to_index: dict[str, str] | None,
) -> None:
    """AllenNLP's layout: one float32 dataset per sentence under its key, and
    `sentence_to_index`, a (1,) string dataset holding the JSON of the
    sentence -> key map (unless None)."""
    import h5py

    with h5py.File(path, "w") as file:
        for position, output in vectors():
            file.create_dataset(keys[position], output.shape, dtype="float32", data=output)
        if sentence_to_index is not None:
            dataset = file.create_dataset(
                "sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str)
            )
            dataset[0] = json.dumps(sentence_to_index)


def write_docbin(path: Path, docs: list, vectors: Callable) -> None:
    """A DocBin of the docs, in line order, each with doc._.elmo set
    ((1, n, D) with --top or --average)."""
    from spacy.tokens import DocBin

    from ..extensions import set_layers

    for position, output in vectors():
        set_layers(docs[position], output if output.ndim == 3 else output[None])
    DocBin(store_user_data=True, docs=docs).to_disk(path)


def _output_mode(all_layers: bool, top: bool, average: bool) -> str:
    flags = {"all": all_layers, "top": top, "average": average}
    chosen = [name for name, flag in flags.items() if flag]
    if len(chosen) > 1:
        raise ElmoSpacyError(f"--{' and --'.join(chosen)}: choose one of --all, --top, --average")
    return chosen[0] if chosen else "all"


def _check_format(output_format: str, use_sentence_keys: bool, forget_sentences: bool) -> None:
    if output_format not in FORMATS:
        raise ElmoSpacyError(f"--output-format {output_format}: use one of {', '.join(FORMATS)}")
    if output_format == "spacy" and (use_sentence_keys or forget_sentences):
        raise ElmoSpacyError(
            "--use-sentence-keys and --forget-sentences shape HDF5 output: a DocBin keeps the "
            "docs in line order, with their text"
        )


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


def _check_sentence_keys(lines: list[str], indices: list[int]) -> None:
    """Sentences as HDF5 keys: refuse what AllenNLP would fail on half way (a
    repeated sentence), and what HDF5 cannot name (an empty line, a "/")."""
    seen: dict[str, int] = {}
    for i in indices:
        sentence = lines[i]
        if not sentence or sentence == "." or "/" in sentence:
            raise ElmoSpacyError(
                f"Line {i + 1} ({sentence!r:.60}) cannot be an HDF5 key (empty, '.' or with a '/'): "
                "drop --use-sentence-keys to key the datasets by line index"
            )
        if sentence in seen:
            raise ElmoSpacyError(
                f"Lines {seen[sentence] + 1} and {i + 1} hold the same sentence, so --use-sentence-keys "
                "would give two datasets one key: drop the flag to key them by line index"
            )
        seen[sentence] = i


def _sentence_to_index(lines: list[str], indices: list[int]) -> dict[str, str]:
    """Sentence -> key (its line index) in line order: a repeated sentence maps
    to its last line, as in AllenNLP."""
    return {lines[i]: str(i) for i in indices}


def _tokenization(tokenize: bool, lang: str | None, recorded) -> "Tokenization":
    """How the lines are cut: spaCy's tokenizer (--tokenize; --lang, or the
    language the biLM records, or English) or white space. Says so on stderr
    where that is not how the biLM's own text was cut."""
    from ..bilm.inputs.tokenization import WHITESPACE, Tokenization

    spacy_biLM = recorded is not None and recorded.tokenizer == "spacy"
    if not tokenize:
        if spacy_biLM:
            _say(
                f"The biLM learned {recorded}; the lines are split on white space. Pass "
                "--tokenize to cut them as its text was cut."
            )
        return WHITESPACE
    chosen = Tokenization("spacy", lang or (recorded.lang if spacy_biLM else "en"))
    if recorded is not None and recorded != chosen:
        _say(f"The biLM learned {recorded}; the lines are cut by {chosen}.")
    return chosen


def _say(message: str) -> None:
    typer.secho(message, fg="yellow", err=True)


def _docs(tokenize: bool, lang: str, lines: list[str]) -> list:
    """The docs of the DocBin: spaCy's tokenisation of each line, or a doc of
    its space-separated tokens."""
    from spacy.tokens import Doc

    from ..tokenizer import blank

    nlp = blank(lang, f"--lang {lang}")
    if tokenize:
        return list(nlp.tokenizer.pipe(lines))
    return [Doc(nlp.vocab, words=line.split()) for line in lines]
