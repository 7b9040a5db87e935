"""bilm-tf's format, `options.json` + `weights.hdf5`: the published ELMo models.

`read_bilm_tf` builds a `BiLM` that computes what bilm-tf computes from such
a pair of files; `write_bilm_tf` writes a char-CNN biLM in that format. How
the datasets map to the biLM's parameters: `_layout` (and docs/models.md).
"""

import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy
import torch

from ...files import write_directory
from ..bilm import BiLM
from ..inputs.tokenization import WHITESPACE
from ..inputs.vocab import WordVocab
from ..model.config import BiLMConfig
from .checks import (
    BiLMLoadError,
    check_shapes,
    existing,
    listing,
    read_json,
    refuse_unknown,
    settings_of,
)
from .efml import is_efml_folder

OPTIONS_FILE, WEIGHTS_FILE = "options.json", "weights.hdf5"
# Pairs known by name; `<name>_options.json` + `<name>_weights.hdf5` are found by pattern.
NAMED_PAIRS = ((OPTIONS_FILE, WEIGHTS_FILE), (OPTIONS_FILE, "model.hdf5"))
PAIR_FILES = (
    "options.json + weights.hdf5, <name>_options.json + <name>_weights.hdf5, "
    "options.json + model.hdf5 (NLPL), or one bilm-tf options .json and one weights "
    ".hdf5 of any names (AllenNLP's options.json + lm_weights.hdf5)"
)
# How a pair is given, for the messages that ask for one.
PAIR_FORMS = (
    "load_bilm((OPTIONS_JSON, WEIGHTS_HDF5)) or Embedder((OPTIONS_JSON, WEIGHTS_HDF5)) in "
    'Python, bilm_path = ["OPTIONS_JSON", "WEIGHTS_HDF5"] in a config, elmo-spacy embed '
    "(or export) OPTIONS_JSON ... --weight-file WEIGHTS_HDF5 on the command line "
    "(convert-elmo: OPTIONS_JSON WEIGHTS_HDF5 OUTPUT_DIR)"
)
GIVE_PAIR = f"give the two files as a pair, (OPTIONS_JSON, WEIGHTS_HDF5): {PAIR_FORMS}."
WEIGHTS_SUFFIXES = (".hdf5", ".h5")
Folder = Path | zipfile.Path  # a folder on disk, or one in a zip archive
MAX_OPTIONS_BYTES = 1 << 20  # options files are < 1 kB; larger JSON files are not read
FORGET_BIAS = 1.0  # what TensorFlow's LSTMCell adds to the forget gate
N_CHARACTERS = 262  # bilm-tf's options: 261 ids and the padding-token row of its runtime
KNOWN_OPTIONS = {
    "lstm": {"dim", "projection_dim", "n_layers", "cell_clip", "proj_clip", "use_skip_connections"},
    "char_cnn": {
        "activation",
        "filters",
        "n_highway",
        "embedding",
        "n_characters",
        "max_characters_per_token",
    },
}
# Training settings that bilm-tf writes into options.json; they do not change the forward pass.
TRAINING_OPTIONS = {
    "bidirectional",
    "dropout",
    "all_clip_norm_val",
    "n_epochs",
    "n_train_tokens",
    "batch_size",
    "n_tokens_vocab",
    "unroll_steps",
    "n_negative_samples_batch",
    "sample_softmax",
    "share_embedding_softmax",
}


class BilmTfFormatError(BiLMLoadError):
    """An options.json / weights.hdf5 pair that cannot be read, with what and where."""


def config_from_options(options: dict[str, Any], where: str) -> BiLMConfig:
    """The BiLMConfig of a bilm-tf options dict (refusing keys it does not know)."""
    refuse_unknown(options, KNOWN_OPTIONS, TRAINING_OPTIONS, where, BilmTfFormatError, "options")
    if "char_cnn" not in options:
        raise BilmTfFormatError(
            f"{where} has no char_cnn section: a bilm-tf model on word ids. Only character "
            "models (all the published ELMo models) can be converted."
        )
    if not options.get("bidirectional", True):
        raise BilmTfFormatError(f"{where}: bidirectional is false; a biLM needs both directions")
    lstm, cnn = options.get("lstm", {}), options["char_cnn"]
    with settings_of(where, BilmTfFormatError, "option"):
        if cnn.get("n_characters", N_CHARACTERS) not in (261, 262):
            raise BilmTfFormatError(
                f"{where}: char_cnn.n_characters = {cnn['n_characters']}; bilm-tf models have "
                "261 (training) or 262 (inference)"
            )
        if lstm["dim"] < lstm["projection_dim"]:
            raise BilmTfFormatError(
                f"{where}: lstm.dim = {lstm['dim']} is below lstm.projection_dim = "
                f"{lstm['projection_dim']}; bilm-tf projects the LSTM down, or not at all"
            )
        projects = lstm["dim"] != lstm["projection_dim"]
        return BiLMConfig(
            encoder="char_cnn",
            char_ids="bilm_tf",
            max_chars=cnn["max_characters_per_token"],
            char_dim=cnn["embedding"]["dim"],
            filters=cnn["filters"],
            n_highway=cnn.get("n_highway") or 0,
            char_activation=cnn["activation"],
            projection_dim=lstm["projection_dim"],
            lstm_dim=lstm["dim"],
            n_layers=lstm["n_layers"],
            cell_clip=lstm.get("cell_clip") or None,
            # TensorFlow's LSTMCell clips the projection only, if there is one.
            proj_clip=(lstm.get("proj_clip") or None) if projects else None,
            skip_connections=bool(lstm.get("use_skip_connections", False)),
            forget_bias=FORGET_BIAS,
            dropout=0.0,
            min_count=1,
        )


def options_from_config(config: BiLMConfig) -> dict[str, Any]:
    """The bilm-tf options of a char-CNN biLM in the format's architecture."""
    problems = []
    if config.encoder != "char_cnn":
        problems.append(
            f"its encoder is {config.encoder!r}; runtimes of the format read characters, so "
            "only char-CNN biLMs can be exported (pretrain with configs/bilm_elmo.cfg)"
        )
    elif config.char_ids != "bilm_tf":
        problems.append(
            f"its char CNN uses char_ids = {config.char_ids!r}; the format's runtimes use "
            "bilm-tf's ids (char_ids = 'bilm_tf', as in configs/bilm_elmo.cfg)"
        )
    if config.lstm_dim < config.projection_dim:
        problems.append("its LSTM projects up (lstm_dim < projection_dim)")
    if problems:
        raise BilmTfFormatError(
            "This biLM cannot be exported to bilm-tf's format: " + "; ".join(problems)
        )
    lstm: dict[str, Any] = {
        "dim": config.lstm_dim,
        "projection_dim": config.projection_dim,
        "n_layers": config.n_layers,
        "use_skip_connections": config.skip_connections,
    }
    if config.cell_clip:
        lstm["cell_clip"] = config.cell_clip
    if config.proj_clip:
        lstm["proj_clip"] = config.proj_clip
    return {
        "lstm": lstm,
        "char_cnn": {
            "activation": config.char_activation,
            "filters": [list(f) for f in config.filters],
            "n_highway": config.n_highway,
            "embedding": {"dim": config.char_dim},
            "n_characters": N_CHARACTERS,
            "max_characters_per_token": config.max_chars,
        },
    }


def expected_shapes(config: BiLMConfig) -> dict[str, tuple[int, ...]]:
    """Every dataset of weights.hdf5 for this architecture, with its shape."""
    return {name: shape for datasets, *_ in _layout(config) for name, shape in datasets.items()}


DatasetProgress = Callable[[Iterable[str]], Iterable[str]]  # e.g. tqdm, around dataset names


def read_bilm_tf(
    options_path: str | Path,
    weights_path: str | Path,
    progress: DatasetProgress = iter,
    names: tuple[str, str] | None = None,
) -> BiLM:
    """A BiLM (without softmax) that computes what bilm-tf computes from these
    files. `progress` wraps the dataset names; `names`: the files' in messages."""
    import h5py

    options_path, weights_path = _checked_pair(options_path, weights_path)
    options_name, weights_name = names or (str(options_path), str(weights_path))
    options = read_json(options_path, BilmTfFormatError, options_name)
    if not isinstance(options, dict):
        raise BilmTfFormatError(f"{options_name} is not a JSON object of bilm-tf options")
    config = config_from_options(options, options_name)
    shapes = expected_shapes(config)
    try:
        file = h5py.File(weights_path, "r")
    except OSError as err:
        raise BilmTfFormatError(f"{weights_name} is not a readable HDF5 file ({err})") from err
    with file:
        stored = {name: file.get(name) for name in shapes}
        found = {k: v.shape for k, v in stored.items() if isinstance(v, h5py.Dataset)}
        described_by = f"the model {options_name} describes"
        check_shapes(
            found, shapes, where=weights_name, described_by=described_by, error=BilmTfFormatError
        )
        arrays = {
            name: numpy.asarray(stored[name][...], dtype="float32") for name in progress(shapes)
        }
    bilm = BiLM(config, WordVocab.specials_only(), with_softmax=False, tokenization=WHITESPACE)
    state = bilm.state_dict()
    for datasets, parameters, to_torch, _ in _layout(config):
        values = to_torch(*(arrays[name] for name in datasets))
        for name, value in zip(parameters, values):
            state[name] = torch.from_numpy(numpy.ascontiguousarray(value))
    bilm.load_state_dict(state)
    bilm.eval()
    return bilm


def read_zipped_bilm_tf(
    archive: str | Path, options: str, weights: str, progress: DatasetProgress = iter
) -> BiLM:
    """`read_bilm_tf` of two members of a zip archive, extracted to a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="elmo-spacy-") as folder:
        copies = Path(folder) / OPTIONS_FILE, Path(folder) / WEIGHTS_FILE
        try:
            with zipfile.ZipFile(archive) as opened:
                for member, copy in zip((options, weights), copies):
                    with opened.open(member) as source, copy.open("wb") as target:
                        shutil.copyfileobj(source, target, 1 << 20)
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise BiLMLoadError(
                f"Cannot extract {options} and {weights} from {archive} into {folder} ({err}): "
                "the archive may be truncated or corrupt (download it again), or the temporary "
                "folder full (set TMPDIR to a folder with room)."
            ) from err
        return read_bilm_tf(
            *copies, progress, names=(f"{archive}:{options}", f"{archive}:{weights}")
        )


def _checked_pair(options: str | Path, weights: str | Path) -> tuple[Path, Path]:
    files = []
    for role, file in (("options", options), ("weights", weights)):
        where = f"The {role} file of the bilm-tf pair (OPTIONS_JSON, WEIGHTS_HDF5)"
        if not isinstance(file, (str, os.PathLike)):
            raise BiLMLoadError(
                f"{where} is {file!r:.120}, of type {type(file).__name__}: give the path of "
                "each file (a str or Path)."
            )
        files.append(existing(file, f"{where}: "))
        if not files[-1].is_file():
            raise BiLMLoadError(
                f"{where}, {files[-1]}, is a folder: a pair names the two files of a bilm-tf "
                "model. For a folder or an NLPL .zip, give that path alone."
            )
    if not is_options_file(files[0]) and is_options_file(files[1]):
        raise BiLMLoadError(
            f"The pair ({files[0]}, {files[1]}) is the wrong way round: {files[1]} holds the "
            "options. Give the options first, then the weights: (OPTIONS_JSON, WEIGHTS_HDF5)."
        )
    return files[0], files[1]


def find_pair(folder: Path) -> tuple[Path, Path] | None:
    """The (options, weights) files of the bilm-tf model in `folder`, or None."""
    return choose_pair(folder, str(folder), looks_like_weights) if folder.is_dir() else None


def find_zipped_pair(path: Path) -> tuple[Path, str, str] | None:
    """(archive, options member, weights member): the bilm-tf model at the top
    level of the zip archive `path`, or else in its one first-level folder
    that holds one. None if `path` is not a zip archive."""
    if not path.is_file() or not (path.suffix.lower() == ".zip" or zipfile.is_zipfile(path)):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            members = [name for name in archive.namelist() if not name.endswith("/")]
            top = zipfile.Path(archive)
            inside = [p for p in top.iterdir() if p.is_dir() and not p.name.startswith("__MACOSX")]
            folders = [top, *sorted(inside, key=lambda folder: folder.at)]
            found = []
            for folder in folders:
                pair = choose_pair(folder, f"{path}:{folder.at}", lambda member: True)
                if pair is not None:
                    found.append((path, pair[0].at, pair[1].at))
                    if folder is top:  # the top level wins
                        return found[-1]
            if len(found) == 1:
                return found[0]
            if found:
                raise BiLMLoadError(
                    f"{path} holds a bilm-tf model in more than one folder ("
                    + ", ".join(options.rpartition("/")[0] + "/" for _, options, _ in found)
                    + "): unpack the archive and point to one of them."
                )
            if any(is_efml_folder(folder) for folder in folders):
                raise BiLMLoadError(
                    f"{path} holds an ELMoForManyLangs model: unpack the archive (unzip "
                    f"{path.name}) and point to the folder that holds its config.json."
                )
    except zipfile.BadZipFile as err:
        raise BiLMLoadError(
            f"{path} is not a readable zip archive ({err}): a download may have stopped "
            "early; download it again."
        ) from err
    raise BiLMLoadError(
        f"{path} is a zip archive, but holds no bilm-tf model ({PAIR_FILES}) at its top level "
        f"or in a first-level folder. It holds: {listing(members)}. "
        "If it holds a model in a deeper folder, unpack it and point to that folder."
    )


def choose_pair(
    folder: Folder, where: str, is_weights: Callable[[Folder], bool]
) -> tuple[Folder, Folder] | None:
    """The (options, weights) files in `folder`: a pair known by name, or else
    the only options .json and the only weights .hdf5."""
    files = {file.name: file for file in folder.iterdir() if file.is_file()}
    named = {(o, w) for o, w in NAMED_PAIRS if o in files and w in files}
    for options in files:
        if options.endswith("_" + OPTIONS_FILE):
            weights = options[: -len(OPTIONS_FILE)] + WEIGHTS_FILE
            if weights in files:
                named.add((options, weights))
    if not named:
        json_files = [n for n in sorted(files) if n.lower().endswith(".json")]
        options = [n for n in json_files if is_options_file(files[n])]
        weights = [n for n in sorted(files) if n.lower().endswith(WEIGHTS_SUFFIXES)]
        if len(weights) > 1:
            weights = [n for n in weights if is_weights(files[n])] or weights
        named = {(o, w) for o in options for w in weights}
    if len(named) > 1:
        raise BiLMLoadError(
            f"{where} holds more than one candidate bilm-tf model ("
            + "; ".join(f"{o} + {w}" for o, w in sorted(named))
            + f"): keep one pair in the folder, or {GIVE_PAIR}"
        )
    if not named:
        return None
    options, weights = named.pop()
    return files[options], files[weights]


def is_options_file(path: Folder) -> bool:
    """Whether the file `path` is small and a JSON object with a section of bilm-tf options."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_OPTIONS_BYTES + 1)
        options = json.loads(data) if len(data) <= MAX_OPTIONS_BYTES else None
    except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8
        return False
    return isinstance(options, dict) and any(key in options for key in KNOWN_OPTIONS)


def looks_like_weights(path: Path) -> bool:
    """Whether an HDF5 file holds bilm-tf weights (its LSTM or char embedding)."""
    import h5py

    try:
        with h5py.File(path, "r") as file:
            return "RNN_0" in file or "char_embed" in file
    except OSError:
        return False


def write_bilm_tf(bilm: BiLM, output_dir: str | Path) -> tuple[Path, Path]:
    """Write `options.json` and `weights.hdf5` of `bilm` into `output_dir`, all at once."""
    import h5py

    options = options_from_config(bilm.config)
    state = {k: v.detach().cpu().numpy() for k, v in bilm.state_dict().items()}
    arrays = {}
    for datasets, parameters, _, to_tf in _layout(bilm.config):
        values = to_tf(*(state[name] for name in parameters))
        for name, value in zip(datasets, values):
            arrays[name] = numpy.ascontiguousarray(value, dtype="float32")

    def write(folder: Path) -> None:
        (folder / OPTIONS_FILE).write_text(json.dumps(options, indent=2) + "\n", encoding="utf-8")
        with h5py.File(folder / WEIGHTS_FILE, "w") as file:
            for name, array in arrays.items():
                file.create_dataset(name, data=array)

    output_dir = write_directory(output_dir, write, owned=(OPTIONS_FILE, WEIGHTS_FILE))
    return output_dir / OPTIONS_FILE, output_dir / WEIGHTS_FILE


def _swap_gates(gates: numpy.ndarray) -> numpy.ndarray:
    """Gate blocks along axis 0 between TensorFlow's order (i, j, f, o) and
    torch's (i, f, j, o): the middle two swapped, each order to the other."""
    i, j, f, o = numpy.split(gates, 4)
    return numpy.concatenate([i, f, j, o])


# Datasets with their shapes, the parameters they make, and the functions
# datasets -> parameters and parameters -> datasets.
Layout = list[tuple[dict[str, tuple[int, ...]], tuple[str, ...], Callable, Callable]]


def _layout(config: BiLMConfig) -> Layout:
    """The datasets of weights.hdf5 in groups, each with the BiLM parameters it
    makes. TensorFlow stores `x @ W`, torch `x @ W.T`; our highway gate
    carries the input, bilm-tf's the transform (hence -carry); bias_hh holds
    the constant forget bias that TensorFlow's LSTMCell adds itself."""
    n_filters = sum(n for _, n in config.filters)
    dim, cell, char_dim = config.projection_dim, config.lstm_dim, config.char_dim
    forget_bias = numpy.zeros(4 * cell, dtype="float32")
    forget_bias[cell : 2 * cell] = FORGET_BIAS
    layout: Layout = []

    def add(datasets: dict, parameters: tuple, to_torch=_same, to_tf=_same) -> None:
        layout.append((datasets, parameters, to_torch, to_tf))

    add({"char_embed": (261, char_dim)}, ("encoder.embed.weight",))
    for i, (width, n) in enumerate(config.filters):  # (1, w, c, n) <-> (n, c, w)
        conv = f"encoder.convs.{i}"
        add(
            {f"CNN/W_cnn_{i}": (1, width, char_dim, n)},
            (f"{conv}.weight",),
            lambda w: (w[0].transpose(2, 1, 0),),
            lambda w: (w.transpose(2, 1, 0)[None],),
        )
        add({f"CNN/b_cnn_{i}": (n,)}, (f"{conv}.bias",))
    f, shapes = n_filters, {"W": (n_filters, n_filters), "b": (n_filters,)}
    for k in range(config.n_highway):
        high, layer = f"CNN_high_{k}", f"encoder.highway.layers.{k}"
        add(
            {
                f"{high}/{p}_{part}": shapes[p]
                for part in ("carry", "transform")
                for p in ("W", "b")
            },
            (f"{layer}.weight", f"{layer}.bias"),
            lambda wc, bc, wt, bt: (
                numpy.concatenate([wt.T, -wc.T]),
                numpy.concatenate([bt, -bc]),
            ),
            lambda w, b: (-w[f:].T, -b[f:], w[:f].T, b[:f]),
        )
    if n_filters != dim:
        datasets = {"CNN_proj/W_proj": (n_filters, dim), "CNN_proj/b_proj": (dim,)}
        add(datasets, ("encoder.projection.weight", "encoder.projection.bias"), _t, _t)
    for direction, stack in enumerate(("forward_lstm", "backward_lstm")):
        for layer in range(config.n_layers):
            path = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            lstm = f"{stack}.layers.{layer}"
            add(
                {f"{path}/W_0": (2 * dim, 4 * cell)},
                (f"{lstm}.weight_ih_l0", f"{lstm}.weight_hh_l0"),
                lambda w: (_swap_gates(w[:dim].T), _swap_gates(w[dim:].T)),
                lambda ih, hh: (numpy.concatenate([_swap_gates(ih).T, _swap_gates(hh).T]),),
            )
            add(
                {f"{path}/B": (4 * cell,)},
                (f"{lstm}.bias_ih_l0", f"{lstm}.bias_hh_l0"),
                lambda b: (_swap_gates(b), forget_bias),
                lambda ih, hh: (_swap_gates(ih + (hh - forget_bias)),),
            )
            if cell != dim:
                add({f"{path}/W_P_0": (cell, dim)}, (f"{lstm}.weight_hr_l0",), _t, _t)
    return layout


def _same(*arrays: numpy.ndarray) -> tuple[numpy.ndarray, ...]:
    return arrays


def _t(*arrays: numpy.ndarray) -> tuple[numpy.ndarray, ...]:
    """Weights transposed (x @ W <-> x @ W.T), biases as they are."""
    return tuple(a.T for a in arrays)
