"""ELMoForManyLangs' format: a model folder as HIT-SCIR published it.

`read_efml(folder)` builds a `BiLM` that computes what ELMoForManyLangs'
`Embedder.sents2elmo(..., output_layer=-2)` computes for a sentence run from
zero LSTM state. The folder and how its weights map to the biLM's: docs/models.md.
"""

import pickle
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from ..bilm import BiLM
from ..inputs.tokenization import WHITESPACE
from ..inputs.vocab import EFML_SPECIALS, WordVocab
from ..model.config import BiLMConfig
from .checks import (
    BiLMLoadError,
    are_missing,
    check_shapes,
    existing,
    read_json,
    refuse_unknown,
    settings_of,
)

ARGS_FILE = "config.json"
CHAR_DIC, WORD_DIC = "char.dic", "word.dic"
TOKEN_EMBEDDER_FILE, ENCODER_FILE = "token_embedder.pkl", "encoder.pkl"
WEIGHT_FILES = (TOKEN_EMBEDDER_FILE, ENCODER_FILE)
IDEOGRAPHIC_SPACE = "\u3000"  # what a dictionary line with one field stands for

# The architecture that the published models' config.json names, by file name.
PUBLISHED_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "cnn_50_100_512_4096_sample.json": {
        "encoder": {
            "name": "elmo",
            "projection_dim": 512,
            "cell_clip": 3,
            "proj_clip": 3,
            "dim": 4096,
            "n_layers": 2,
        },
        "token_embedder": {
            "name": "cnn",
            "activation": "relu",
            "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
            "n_highway": 2,
            "word_dim": 100,
            "char_dim": 50,
            "max_characters_per_token": 50,
        },
    }
}


# The keys an architecture may have: those of the published one.
KNOWN_SECTIONS = {
    section: set(values)
    for section, values in PUBLISHED_ARCHITECTURES["cnn_50_100_512_4096_sample.json"].items()
}
# Training settings of the architecture file; they do not change the forward pass.
TRAINING_SECTIONS = {"classifier", "dropout"}


class EfmlFormatError(BiLMLoadError):
    """An ELMoForManyLangs model folder that cannot be read, with what and where."""


def is_efml_folder(folder: Path | zipfile.Path) -> bool:
    """Whether `folder` is (or is meant to be) an ELMoForManyLangs model."""
    names = (*WEIGHT_FILES, CHAR_DIC, WORD_DIC)
    return folder.is_dir() and any((folder / name).is_file() for name in names)


def read_efml(
    folder: str | Path, progress: Callable[[Iterable[str]], Iterable[str]] = iter
) -> BiLM:
    """A BiLM (without softmax) that computes what ELMoForManyLangs computes
    from the model in `folder`; `progress` wraps the weight files' names."""
    folder = existing(folder)
    architecture, architecture_name = _architecture(folder)
    config = config_from_architecture(architecture, architecture_name)
    uses_chars, uses_words = config.encoder != "word", config.encoder != "char_cnn"
    needed = [*([CHAR_DIC] if uses_chars else []), *([WORD_DIC] if uses_words else [])]
    missing = [name for name in (*needed, *WEIGHT_FILES) if not (folder / name).is_file()]
    if missing:
        raise EfmlFormatError(
            f"{folder} is an incomplete ELMoForManyLangs model: {are_missing(missing)}. Unpack "
            "the whole archive of the model into the folder."
        )
    embedder, encoder = (_read_weights(folder / name) for name in progress(WEIGHT_FILES))
    layouts = _layouts(config)
    for path, tensors, layout in zip(
        (folder / n for n in WEIGHT_FILES), (embedder, encoder), layouts
    ):
        check_shapes(
            {name: tuple(tensor.shape) for name, tensor in tensors.items()},
            {name: shape for name, (_, shape) in layout.items()},
            where=str(path),
            described_by="the model's architecture",
            error=EfmlFormatError,
            unexpected=True,
        )

    chars = None
    if uses_chars:
        chars = _in_id_order(folder / CHAR_DIC, embedder["char_emb_layer.embedding.weight"])
    vocab = WordVocab.specials_only()
    if uses_words:
        table = embedder["word_emb_layer.embedding.weight"]
        ids = {word: i for i, word in enumerate(_in_id_order(folder / WORD_DIC, table))}
        absent = [special for special in EFML_SPECIALS if special not in ids]
        if absent:
            raise EfmlFormatError(
                f"{folder / WORD_DIC} lacks {absent}: ELMoForManyLangs' word dictionaries "
                f"hold {list(EFML_SPECIALS)}"
            )
        words = [*EFML_SPECIALS, *(word for word in ids if word not in EFML_SPECIALS)]
        embedder["word_emb_layer.embedding.weight"] = table[[ids[word] for word in words]]
        vocab = WordVocab(words)

    bilm = BiLM(config, vocab, with_softmax=False, char_vocab=chars, tokenization=WHITESPACE)
    state = bilm.state_dict()
    for tensors, layout in zip((embedder, encoder), layouts):
        for name, (parameter, _) in layout.items():
            state[parameter] = tensors[name].contiguous()
    for direction in ("forward", "backward"):  # one trained bias: bias_ih
        for layer in range(config.n_layers):
            state[f"{direction}_lstm.layers.{layer}.bias_hh_l0"] = torch.zeros(4 * config.lstm_dim)
    bilm.load_state_dict(state)
    bilm.eval()
    return bilm


def config_from_architecture(architecture: Any, where: str) -> BiLMConfig:
    """The BiLMConfig of an ELMoForManyLangs architecture dict, refusing keys
    and architectures it does not know rather than guess."""
    if not isinstance(architecture, dict):
        raise EfmlFormatError(f"{where} is not a JSON object of an ELMoForManyLangs architecture")
    for section in KNOWN_SECTIONS:
        if not isinstance(architecture.get(section), dict):
            raise EfmlFormatError(f"{where} has no {section!r} section")
    refuse_unknown(architecture, KNOWN_SECTIONS, TRAINING_SECTIONS, where, EfmlFormatError, "keys")
    lstm, tokens = architecture["encoder"], architecture["token_embedder"]
    with settings_of(where, EfmlFormatError, "key"):
        if str(lstm["name"]).lower() != "elmo":
            raise EfmlFormatError(
                f"{where}: encoder.name = {lstm['name']!r}; only ELMo's LSTM ('elmo', what "
                "the published models use) can be read"
            )
        if str(tokens["name"]).lower() != "cnn":
            raise EfmlFormatError(
                f"{where}: token_embedder.name = {tokens['name']!r}; only the char CNN ('cnn', "
                "what the published models use) can be read"
            )
        if lstm["dim"] <= lstm["projection_dim"]:
            raise EfmlFormatError(
                f"{where}: encoder.dim = {lstm['dim']} is not above encoder.projection_dim = "
                f"{lstm['projection_dim']}; this converter reads LSTMs that project down"
            )
        word_dim, char_dim = int(tokens["word_dim"]), int(tokens["char_dim"])
        if word_dim <= 0 and char_dim <= 0:
            raise EfmlFormatError(f"{where}: token_embedder has neither words nor characters")
        encoder = "word_char" if word_dim > 0 and char_dim > 0 else "word"
        if word_dim <= 0:
            encoder = "char_cnn"
        return BiLMConfig(
            encoder=encoder,
            char_ids="char_vocab",
            max_chars=tokens["max_characters_per_token"],
            char_dim=max(char_dim, 1),
            filters=tokens["filters"],
            char_activation=tokens["activation"],
            n_highway=tokens["n_highway"],
            word_dim=max(word_dim, 1),
            projection_dim=lstm["projection_dim"],
            lstm_dim=lstm["dim"],
            n_layers=lstm["n_layers"],
            cell_clip=lstm.get("cell_clip") or None,
            proj_clip=lstm.get("proj_clip") or None,
            skip_connections=True,
            forget_bias=0.0,  # one trained bias (AllenNLP's cell), nothing added
            dropout=0.0,
            min_count=1,
        )


def read_dictionary(path: Path) -> dict[str, int]:
    """`token<TAB>id` lines as the reference reads them: each line stripped of
    surrounding whitespace, a line with one field taken as U+3000 (which the
    stripping removed), a later line for the same token winning."""
    entries: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise EfmlFormatError(f"{path} is not a readable UTF-8 dictionary ({err})") from err
    for number, line in enumerate(lines, 1):
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, IDEOGRAPHIC_SPACE)
        try:
            token, index = fields
            entries[token] = int(index)
        except ValueError as err:
            raise EfmlFormatError(f"{path}:{number}: {line!r} is not a token<TAB>id line") from err
    return entries


def _in_id_order(path: Path, table: torch.Tensor) -> list[str]:
    """The tokens of the dictionary `path` by id, once the ids are checked to
    be the rows of `table` (its embedding), each once."""
    entries, rows = read_dictionary(path), table.shape[0]
    if len(entries) != rows or sorted(entries.values()) != list(range(rows)):
        raise EfmlFormatError(
            f"{path} has {len(entries)} entries (ids {min(entries.values(), default=0)} to "
            f"{max(entries.values(), default=-1)}), but its embedding in "
            f"{path.parent / TOKEN_EMBEDDER_FILE} has {rows} rows: the dictionary and the "
            "weights must be of one model, with ids 0 to rows - 1, each once"
        )
    by_id = [""] * rows
    for token, index in entries.items():
        by_id[index] = token
    return by_id


def _architecture(folder: Path) -> tuple[dict[str, Any], str]:
    """The architecture dict and where it was found."""
    args_path = folder / ARGS_FILE
    if not args_path.is_file():
        raise EfmlFormatError(f"{folder} has no {ARGS_FILE}: it is not an ELMoForManyLangs model")
    args = read_json(args_path, EfmlFormatError)
    if not isinstance(args, dict) or not isinstance(args.get("config_path"), str):
        raise EfmlFormatError(
            f"{args_path} has no config_path: ELMoForManyLangs' config.json names the "
            "architecture file there"
        )
    named = Path(args["config_path"])
    candidates = [folder / named, folder / named.name]
    for candidate in candidates:
        if candidate.is_file():
            return read_json(candidate, EfmlFormatError), str(candidate)
    if named.name in PUBLISHED_ARCHITECTURES:
        return PUBLISHED_ARCHITECTURES[named.name], f"{named.name} (the published models')"
    raise EfmlFormatError(
        f"{args_path} names the architecture file {args['config_path']}, which is neither "
        f"there nor in {folder}: copy that file (ELMoForManyLangs ships its architectures in "
        "elmoformanylangs/configs/) into the folder."
    )


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state dict of tensors, read without unpickling anything else."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise EfmlFormatError(
            f"{path} is not a file of tensors that torch reads safely ({str(err).splitlines()[0]}"
            "). It is not unpickled any further: a weights file from ELMoForManyLangs holds "
            "tensors only, so this one may be corrupt or from elsewhere."
        ) from err
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise EfmlFormatError(
            f"{path} is not a torch weights file ({str(err).splitlines()[0] if str(err) else err!r}"
            "): it may be truncated or corrupt; unpack the model's archive again."
        ) from err
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise EfmlFormatError(
            f"{path} holds a {type(state).__name__}, not a state dict of named tensors as "
            "ELMoForManyLangs writes them"
        )
    return {k: v.float() for k, v in state.items()}


Layout = dict[str, tuple[str, tuple[int, ...]]]


def _layouts(config: BiLMConfig) -> tuple[Layout, Layout]:
    """token_embedder.pkl's and encoder.pkl's tensors for this architecture:
    name -> (the BiLM parameter it is, its shape; -1: rows left open)."""
    dim, cell, char_dim = config.projection_dim, config.lstm_dim, config.char_dim
    chars = "encoder.chars." if config.encoder == "word_char" else "encoder."
    embedder: Layout = {}
    width = 0
    if config.encoder != "char_cnn":
        width = config.word_dim
        embedder["word_emb_layer.embedding.weight"] = ("encoder.embed.weight", (-1, width))
    if config.encoder != "word":
        embedder["char_emb_layer.embedding.weight"] = (f"{chars}embed.weight", (-1, char_dim))
        for i, (kernel, n) in enumerate(config.filters):
            conv = f"{chars}convs.{i}"
            embedder[f"convolutions.{i}.weight"] = (f"{conv}.weight", (n, char_dim, kernel))
            embedder[f"convolutions.{i}.bias"] = (f"{conv}.bias", (n,))
        n_filters = sum(n for _, n in config.filters)
        for k in range(config.n_highway):
            high, both = f"{chars}highway.layers.{k}", 2 * n_filters
            embedder[f"highways._layers.{k}.weight"] = (f"{high}.weight", (both, n_filters))
            embedder[f"highways._layers.{k}.bias"] = (f"{high}.bias", (both,))
        width += n_filters
    embedder["projection.weight"] = ("encoder.projection.weight", (dim, width))
    embedder["projection.bias"] = ("encoder.projection.bias", (dim,))
    encoder: Layout = {}
    for direction in ("forward", "backward"):
        for layer in range(config.n_layers):
            source, target = f"{direction}_layer_{layer}", f"{direction}_lstm.layers.{layer}"
            for name, parameter, shape in (
                ("input_linearity.weight", "weight_ih_l0", (4 * cell, dim)),
                ("state_linearity.weight", "weight_hh_l0", (4 * cell, dim)),
                ("state_linearity.bias", "bias_ih_l0", (4 * cell,)),
                ("state_projection.weight", "weight_hr_l0", (dim, cell)),
            ):
                encoder[f"{source}.{name}"] = (f"{target}.{parameter}", shape)
    return embedder, encoder
