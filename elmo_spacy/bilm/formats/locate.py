"""What a biLM path points to: the layouts that `load_bilm`, `Embedder`, the
`elmo` pipe's `bilm_path` and the commands (`embed`, `export`,
`convert-elmo`) accept, found by looking (file names, and the keys of small
JSON files) before any weights are read.

The layouts accepted are `LAYOUTS`: a path, looked for in that order, or a
bilm-tf model's two files given as a pair, `(options, weights)` (a 2-tuple
or list in Python, a list of two paths as a config's `bilm_path`, the
options file and `--weight-file` on the command line; see `bilm_tf_pair`),
as AllenNLP users hold them: any names, in any folders. In a folder,
bilm-tf's two files are found by their published names first, else as
exactly one options .json (a JSON object with an `lstm` or `char_cnn`
section) and one weights .hdf5 of any names; in an NLPL .zip archive at its
top level or in one folder, the two members extracted to a temporary folder
while they are read (see `bilm_tf_files`). ELMoForManyLangs folders: see
`elmo_spacy.bilm.formats.efml`.

Anything else is refused with a `BiLMLoadError` that says what was found and
what to point to instead. Nothing here imports spaCy.
"""

import difflib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ...errors import ElmoSpacyError
from .bilm_tf import OPTIONS_FILE, WEIGHTS_FILE
from .efml import is_efml_folder

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
SAFETENSORS_FILE = "weights.safetensors"
BILM_FILES = (CONFIG_FILE, VOCAB_FILE, SAFETENSORS_FILE)
TOKENIZATION_FILE = "tokenization.json"  # how its text was tokenised, where known
# Pairs known by name; `<name>_options.json` + `<name>_weights.hdf5` are found by pattern.
NAMED_PAIRS = ((OPTIONS_FILE, WEIGHTS_FILE), (OPTIONS_FILE, "model.hdf5"))
OPTIONS_SECTIONS = ("lstm", "char_cnn")  # what makes a JSON object bilm-tf options
WEIGHTS_SUFFIXES = (".hdf5", ".h5")
MAX_OPTIONS_BYTES = 1 << 20  # options files are < 1 kB; larger JSON files are not read
PRETRAIN_OUTPUTS = ("model-best", "model-last")

BILM_DIR, BILM_TF, BILM_TF_ZIP, EFML = "bilm", "bilm_tf", "bilm_tf_zip", "efml"
BILM_TF_PAIR = "bilm_tf_pair"

# Where a biLM is: a path (a folder, an NLPL .zip), or the pair of a bilm-tf
# model's files, (options .json, weights .hdf5), as a 2-tuple or list.
BiLMPath = str | os.PathLike | Sequence[str | os.PathLike]
# How a pair is given, for the messages that ask for one.
PAIR_FORMS = (
    "load_bilm((OPTIONS_JSON, WEIGHTS_HDF5)) or Embedder((OPTIONS_JSON, WEIGHTS_HDF5)) in "
    'Python, bilm_path = ["OPTIONS_JSON", "WEIGHTS_HDF5"] in a config, elmo-spacy embed '
    "(or export) OPTIONS_JSON ... --weight-file WEIGHTS_HDF5 on the command line "
    "(convert-elmo: OPTIONS_JSON WEIGHTS_HDF5 OUTPUT_DIR)"
)


@dataclass(frozen=True)
class Layout:
    """One layout a biLM path may have. `kind`: what `BiLMLocation.kind`
    says where one is found (and `directory.READERS` reads); `name`: what
    help texts call it; `files`: what it holds, for error messages."""

    kind: str
    name: str
    files: str


# Every layout: the paths in the order they are looked for, then the pair,
# which is given rather than found. The one list that `load_bilm`, its error
# messages, `Embedder`, the help of `embed` and `export`, and the pipe read.
LAYOUTS = (
    Layout(
        BILM_DIR,
        "a biLM directory (what pretrain writes into model-best/, and convert-elmo)",
        "config.json + vocab.json + weights.safetensors",
    ),
    Layout(
        BILM_TF,
        "a bilm-tf model folder (the published ELMo files, AllenNLP's, NLPL's unpacked)",
        "options.json + weights.hdf5, <name>_options.json + <name>_weights.hdf5, "
        "options.json + model.hdf5 (NLPL), or one bilm-tf options .json and one weights "
        ".hdf5 of any names (AllenNLP's options.json + lm_weights.hdf5)",
    ),
    Layout(
        BILM_TF_ZIP,
        "an NLPL repository .zip archive",
        "a bilm-tf model at the archive's top level or in one of its folders",
    ),
    Layout(
        EFML,
        "an ELMoForManyLangs model folder",
        "config.json + token_embedder.pkl + encoder.pkl + char.dic and/or word.dic, as "
        "unpacked from its archive",
    ),
    Layout(
        BILM_TF_PAIR,
        "a bilm-tf model's two files as a pair, (options .json, weights .hdf5), of any names "
        "in any folders (as AllenNLP's Elmo takes them)",
        "the options file and the weights file, given as a pair: " + PAIR_FORMS,
    ),
)


def layouts_help() -> str:
    """The accepted layouts in one line, for help texts."""
    return "; ".join(layout.name for layout in LAYOUTS)


class BiLMLoadError(ElmoSpacyError):
    """A biLM path, directory or payload that cannot be loaded, with the reason."""


@dataclass(frozen=True)
class BiLMLocation:
    """Where a biLM is. `kind` is BILM_DIR (the biLM directory `path`),
    BILM_TF (`options` and `weights` are the paths of a bilm-tf pair found in
    the folder `path`), BILM_TF_PAIR (the paths of a pair given as such;
    `path` is the options file's folder), BILM_TF_ZIP (`options` and
    `weights` are members of the zip archive `path`) or EFML (the
    ELMoForManyLangs model folder `path`)."""

    kind: str
    path: Path
    options: str = ""
    weights: str = ""

    def describe(self) -> str:
        """What is there, as a user would name it."""
        if self.kind == BILM_DIR:
            return f"the biLM directory {self.path}"
        if self.kind == EFML:
            return f"the ELMoForManyLangs model {self.path}"
        if self.kind == BILM_TF_ZIP:
            return f"the bilm-tf model {self.options} + {self.weights} in {self.path}"
        return f"the bilm-tf model {self.options} + {self.weights}"

    def file_names(self) -> tuple[str, str]:
        """A bilm-tf model's options and weights, as error messages name them."""
        if self.kind == BILM_TF_ZIP:
            return f"{self.path}:{self.options}", f"{self.path}:{self.weights}"
        return self.options, self.weights


def resolve_bilm_path(path: BiLMPath) -> BiLMLocation:
    """The biLM at `path`: a folder in one of the accepted layouts (see the
    module's docstring) or an NLPL .zip archive, or a bilm-tf model's two
    files as a pair, (options, weights) (a 2-tuple or list, see
    `bilm_tf_pair`). Raises `BiLMLoadError`, saying what is there instead,
    for anything else."""
    if isinstance(path, (tuple, list)):
        if len(path) != 2:
            raise BiLMLoadError(
                f"{_shown(path)} holds {len(path)} path{'' if len(path) == 1 else 's'}: a biLM is one path (a folder, an NLPL "
                ".zip), or a bilm-tf model's two files as a pair, (OPTIONS_JSON, WEIGHTS_HDF5)."
            )
        return bilm_tf_pair(*path)
    if not isinstance(path, (str, os.PathLike)):
        raise BiLMLoadError(
            f"{_shown(path)} is of type {type(path).__name__}, not a biLM path: give a folder (a str "
            "or Path), or a bilm-tf model's two files as a pair, (OPTIONS_JSON, WEIGHTS_HDF5)."
        )
    path = Path(path).expanduser()
    if not path.exists():
        raise BiLMLoadError(_missing_message(path))
    if path.is_dir():
        return _in_folder(path)
    if path.suffix.lower() == ".zip" or zipfile.is_zipfile(path):
        return _in_zip(path)
    raise BiLMLoadError(_not_a_folder_message(path))


def bilm_tf_pair(options: str | os.PathLike, weights: str | os.PathLike) -> BiLMLocation:
    """A bilm-tf model given as its two files, whatever their names and
    folders: `options` (the .json of its options) and `weights` (its .hdf5).
    A missing file, a folder, or the two given the other way round is
    refused with a `BiLMLoadError` that names the file."""
    files = {}
    for role, file in (("options", options), ("weights", weights)):
        if not isinstance(file, (str, os.PathLike)):
            raise BiLMLoadError(
                f"The {role} file of the pair (OPTIONS_JSON, WEIGHTS_HDF5) is {_shown(file)}, "
                f"of type {type(file).__name__}: give the path of each file (a str or Path)."
            )
        file = files[role] = Path(file).expanduser()
        if not file.exists():
            raise BiLMLoadError(
                f"The {role} file of the bilm-tf pair (OPTIONS_JSON, WEIGHTS_HDF5): "
                + _missing_message(file)
            )
        if not file.is_file():
            raise BiLMLoadError(
                f"The {role} file of the bilm-tf pair (OPTIONS_JSON, WEIGHTS_HDF5), {file}, is a "
                "folder: a pair names the two files of a bilm-tf model. For a folder or an NLPL "
                ".zip, give that path alone."
            )
    options, weights = files["options"], files["weights"]
    if not _is_options(_read_small(options)) and _is_options(_read_small(weights)):
        raise BiLMLoadError(
            f"The pair ({options}, {weights}) is the wrong way round: {weights} holds the "
            "options. Give the options first, then the weights: (OPTIONS_JSON, WEIGHTS_HDF5)."
        )
    return BiLMLocation(BILM_TF_PAIR, options.parent, str(options), str(weights))


@contextmanager
def bilm_tf_files(location: BiLMLocation) -> Iterator[tuple[Path, Path]]:
    """The options and weights files of a bilm-tf location, as paths to read
    while the context lasts: the files themselves, or copies of the members
    of a zip archive in a temporary folder that is removed afterwards."""
    if location.kind in (BILM_TF, BILM_TF_PAIR):
        yield Path(location.options), Path(location.weights)
        return
    if location.kind != BILM_TF_ZIP:
        raise ElmoSpacyError(f"{location.describe()} is not a bilm-tf model")
    with tempfile.TemporaryDirectory(prefix="elmo-spacy-") as folder:
        copies = Path(folder) / OPTIONS_FILE, Path(folder) / WEIGHTS_FILE
        try:
            with zipfile.ZipFile(location.path) as archive:
                for member, copy in zip((location.options, location.weights), copies):
                    with archive.open(member) as source, copy.open("wb") as target:
                        shutil.copyfileobj(source, target, 1 << 20)
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise BiLMLoadError(
                f"Cannot extract {location.options} and {location.weights} from {location.path} "
                f"into {folder} ({err}): the archive may be truncated or corrupt (download it "
                "again), or the temporary folder full (set TMPDIR to a folder with room)."
            ) from err
        yield copies


# -- folders -------------------------------------------------------------------


def _in_folder(folder: Path) -> BiLMLocation:
    location = _find_in_folder(folder)
    if location is not None:
        return location
    files = {p.name for p in folder.iterdir() if p.is_file()}
    present = [name for name in BILM_FILES if name in files]
    if present:
        missing = [name for name in BILM_FILES if name not in files]
        raise BiLMLoadError(
            f"{folder} is an incomplete biLM directory: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing (it holds {', '.join(present)}). "
            "Copy the whole folder that `elmo-spacy pretrain` or `convert-elmo` wrote."
        )
    pretraining = _pretraining_message(folder)
    if pretraining:
        raise BiLMLoadError(pretraining)
    raise BiLMLoadError(_nothing_known_message(folder))


def _find_in_folder(folder: Path) -> BiLMLocation | None:
    """The biLM in `folder` in an accepted layout, or None."""
    files = {p.name for p in folder.iterdir() if p.is_file()}
    if all(name in files for name in BILM_FILES):
        return BiLMLocation(BILM_DIR, folder)
    if is_efml_folder(files):
        return BiLMLocation(EFML, folder)
    pair = _choose_pair(
        str(folder),
        files,
        lambda name: _is_options(_read_small(folder / name)),
        lambda name: _looks_like_weights(folder / name),
    )
    if pair is None:
        return None
    return BiLMLocation(BILM_TF, folder, str(folder / pair[0]), str(folder / pair[1]))


def _holds_bilm(folder: Path) -> bool:
    """Whether `folder` holds a biLM, or several (a hint for error messages)."""
    try:
        return _find_in_folder(folder) is not None
    except BiLMLoadError:
        return True
    except OSError:
        return False


def _looks_like_weights(path: Path) -> bool:
    """Whether an HDF5 file holds bilm-tf weights (its LSTM or char embedding)."""
    import h5py

    try:
        with h5py.File(path, "r") as file:
            return "RNN_0" in file or "char_embed" in file
    except OSError:
        return False


def _read_small(path: Path) -> bytes | None:
    try:
        if path.stat().st_size > MAX_OPTIONS_BYTES:
            return None
        return path.read_bytes()
    except OSError:
        return None


# -- zip archives --------------------------------------------------------------


def _in_zip(path: Path) -> BiLMLocation:
    try:
        with zipfile.ZipFile(path) as archive:
            infos = [i for i in archive.infolist() if not i.is_dir()]
            return _pair_in_archive(path, archive, infos)
    except zipfile.BadZipFile as err:
        raise BiLMLoadError(
            f"{path} is not a readable zip archive ({err}): a download may have stopped "
            "early; download it again."
        ) from err


def _pair_in_archive(
    path: Path, archive: zipfile.ZipFile, infos: list[zipfile.ZipInfo]
) -> BiLMLocation:
    """The bilm-tf pair at the top level of the archive, or else in exactly
    one of its first-level subfolders."""
    folders: dict[str, dict[str, zipfile.ZipInfo]] = {}
    for info in infos:
        parts = PurePosixPath(info.filename).parts
        if len(parts) <= 2 and not parts[0].startswith("__MACOSX"):
            folders.setdefault(parts[0] + "/" if len(parts) == 2 else "", {})[parts[-1]] = info
    found: list[tuple[str, tuple[str, str]]] = []
    for prefix in sorted(folders):
        members = folders[prefix]

        def is_options(name: str, members=members) -> bool:
            info = members[name]
            return info.file_size <= MAX_OPTIONS_BYTES and _is_options(archive.read(info))

        pair = _choose_pair(f"{path}:{prefix}", set(members), is_options, lambda name: True)
        if pair is not None:
            if not prefix:  # the top level wins
                return BiLMLocation(BILM_TF_ZIP, path, *pair)
            found.append((prefix, pair))
    if len(found) > 1:
        raise BiLMLoadError(
            f"{path} holds a bilm-tf model in more than one folder ("
            + ", ".join(prefix for prefix, _ in found)
            + "): unpack the archive and point to one of them."
        )
    if found:
        prefix, (options, weights) = found[0]
        return BiLMLocation(BILM_TF_ZIP, path, prefix + options, prefix + weights)
    if any(is_efml_folder(set(members)) for members in folders.values()):
        raise BiLMLoadError(
            f"{path} holds an ELMoForManyLangs model: unpack the archive (unzip {path.name}) "
            "and point to the folder that holds its config.json."
        )
    raise BiLMLoadError(
        f"{path} is a zip archive, but holds no bilm-tf model at its top level or in a "
        "first-level folder. Looked for "
        + _layouts_text()
        + ". It holds: "
        + _listing(info.filename for info in infos)
        + ". If it holds a model in a deeper folder, unpack it and point to that folder."
    )


# -- what both share -----------------------------------------------------------


def _choose_pair(
    where: str,
    files: Collection[str],
    is_options: Callable[[str], bool],
    is_weights: Callable[[str], bool],
) -> tuple[str, str] | None:
    """The (options, weights) names among the file names of one folder: a pair
    known by name, or else the only options .json and the only weights .hdf5.
    None if there is none; `BiLMLoadError` naming them if there are several."""
    named = {(o, w) for o, w in NAMED_PAIRS if o in files and w in files}
    for options in files:
        if options.endswith("_" + OPTIONS_FILE):
            weights = options[: -len(OPTIONS_FILE)] + WEIGHTS_FILE
            if weights in files:
                named.add((options, weights))
    if len(named) > 1:
        raise _several_pairs(where, sorted(named))
    if named:
        return named.pop()
    options = [n for n in sorted(files) if n.lower().endswith(".json") and is_options(n)]
    weights = [n for n in sorted(files) if n.lower().endswith(WEIGHTS_SUFFIXES)]
    if len(weights) > 1:
        weights = [n for n in weights if is_weights(n)] or weights
    if not options or not weights:
        return None
    if len(options) > 1 or len(weights) > 1:
        raise _several_pairs(where, [(o, w) for o in options for w in weights])
    return options[0], weights[0]


def _is_options(data: bytes | None) -> bool:
    """Whether `data` is a JSON object with a section of bilm-tf options."""
    if data is None:
        return False
    try:
        options = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(options, dict) and any(key in options for key in OPTIONS_SECTIONS)


def _several_pairs(where: str, pairs: list[tuple[str, str]]) -> BiLMLoadError:
    names = "; ".join(f"{o} + {w}" for o, w in pairs)
    return BiLMLoadError(
        f"{where} holds more than one candidate bilm-tf model ({names}): keep one pair in the "
        f"folder, or give the two files as a pair, (OPTIONS_JSON, WEIGHTS_HDF5): {PAIR_FORMS}."
    )


def _missing_message(path: Path) -> str:
    """`path` does not exist: where the path breaks off, and the closest names there."""
    missing, parent = path, path.parent
    while not parent.exists():
        missing, parent = parent, parent.parent
    message = f"{path} does not exist"
    if not path.is_absolute():
        message += f" (a relative path, from {Path.cwd()})"
    if missing != path:
        message += f": {parent} has no {missing.name}"
    if parent.is_dir():
        try:
            names = [p.name for p in parent.iterdir()]
        except OSError:
            names = []
        close = difflib.get_close_matches(missing.name, names, n=3, cutoff=0.6)
        if close:
            return message + ". Did you mean " + " or ".join(str(parent / n) for n in close) + "?"
    return message + "."


def _not_a_folder_message(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json" and _is_options(_read_small(path)):
        message = (
            f"{path} is a bilm-tf options file, without its weights: give the two files as a "
            f"pair, (OPTIONS_JSON, WEIGHTS_HDF5): {PAIR_FORMS}."
        )
    elif suffix in WEIGHTS_SUFFIXES and _looks_like_weights(path):
        message = (
            f"{path} holds a bilm-tf model's weights, without its options: give the two files "
            f"as a pair, (OPTIONS_JSON, WEIGHTS_HDF5): {PAIR_FORMS}."
        )
    else:
        message = (
            f"{path} is a file, not a biLM: a biLM path is a folder, or an NLPL ELMo .zip "
            f"archive. Accepted layouts: {_layouts_text()}."
        )
    if _holds_bilm(path.parent):
        return message + f" Or point to the folder that holds it, {path.parent}."
    return message


def _pretraining_message(folder: Path) -> str | None:
    """What to point to, if `folder` is what `elmo-spacy pretrain` writes."""
    outputs = [folder / name for name in PRETRAIN_OUTPUTS if (folder / name).is_dir()]
    checkpoints = sorted(folder.glob("checkpoint-*"))
    if not outputs and not ((folder / "latest-checkpoint").is_file() and checkpoints):
        return None
    start = f"{folder} is the output folder of `elmo-spacy pretrain`, not a biLM: "
    if outputs and outputs[0].name == "model-best":
        return start + f"point to its model-best, {outputs[0]} (the biLM of best dev perplexity)."
    if outputs:
        return start + f"point to its {outputs[0].name}, {outputs[0]} (there is no model-best)."
    return start + (
        "it holds no model-best yet, as pretraining has not finished an epoch; its latest "
        f"checkpoint ({checkpoints[-1].name}) is a biLM directory too."
    )


def _nothing_known_message(folder: Path) -> str:
    entries = sorted(folder.iterdir())
    found = _listing(p.name + ("/" if p.is_dir() else "") for p in entries) or "nothing"
    message = (
        f"{folder} holds no biLM: {CONFIG_FILE} is missing, and no bilm-tf options .json + "
        f"weights .hdf5 pair was found. Accepted layouts: {_layouts_text()}. It holds: {found}."
    )
    inside = [p for p in entries[:50] if p.is_dir() and _holds_bilm(p)]
    if inside:
        message += " Point to " + " or ".join(str(p) for p in inside[:3]) + ", which holds one."
    return message


def _layouts_text() -> str:
    return "; ".join(f"({i}) {layout.name}: {layout.files}" for i, layout in enumerate(LAYOUTS, 1))


def _shown(value: object, limit: int = 120) -> str:
    """`value` as an error message shows it, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _listing(names: Iterable[str], limit: int = 12) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
