"""Every format a biLM comes in, in one table, `FORMATS`, and `load_bilm`,
which reads a path in any of them, or says what is there instead."""

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..bilm import BiLM
from . import bilm_tf, directory
from .bilm_tf import PAIR_FORMS, DatasetProgress, read_bilm_tf
from .checks import BiLMLoadError, existing, listing
from .directory import BILM_FILES, pretraining_message, read_bilm_directory
from .efml import is_efml_folder, read_efml

# Where a biLM is: a path (a folder, an NLPL .zip), or the pair of a bilm-tf
# model's files, (options .json, weights .hdf5), as a 2-tuple or list.
BiLMPath = str | os.PathLike | Sequence[str | os.PathLike]


@dataclass(frozen=True)
class Format:
    """`name` for help texts, `files` (what it holds) for messages; `find`: the
    arguments of `read` if an existing path holds the format, else None (no
    `find` for the pair, which is given)."""

    name: str
    files: str
    find: Callable[[Path], tuple | None] | None
    read: Callable[..., BiLM]


BILM_DIR, BILM_TF, BILM_TF_ZIP = "bilm", "bilm_tf", "bilm_tf_zip"
EFML, BILM_TF_PAIR = "efml", "bilm_tf_pair"

# In the order a path is looked at.
FORMATS = {
    BILM_DIR: Format(
        "a biLM directory (what pretrain writes into model-best/, and convert-elmo)",
        " + ".join(BILM_FILES),
        lambda path: (path,) if all((path / n).is_file() for n in BILM_FILES) else None,
        read_bilm_directory,
    ),
    BILM_TF: Format(
        "a bilm-tf model folder (the published ELMo files, AllenNLP's, NLPL's unpacked)",
        bilm_tf.PAIR_FILES,
        bilm_tf.find_pair,
        read_bilm_tf,
    ),
    BILM_TF_ZIP: Format(
        "an NLPL repository .zip archive",
        "a bilm-tf model at the archive's top level or in one of its folders",
        bilm_tf.find_zipped_pair,
        bilm_tf.read_zipped_bilm_tf,
    ),
    EFML: Format(
        "an ELMoForManyLangs model folder",
        "config.json + token_embedder.pkl + encoder.pkl + char.dic and/or word.dic, as "
        "unpacked from its archive",
        lambda path: (path,) if is_efml_folder(path) else None,
        read_efml,
    ),
    BILM_TF_PAIR: Format(
        "a bilm-tf model's two files as a pair, (options .json, weights .hdf5), of any names "
        "in any folders (as AllenNLP's Elmo takes them)",
        "the options file and the weights file, given as a pair: " + PAIR_FORMS,
        None,
        read_bilm_tf,
    ),
}


def load_bilm(
    path: BiLMPath, with_softmax: bool | None = None, progress: DatasetProgress = iter
) -> BiLM:
    """Read the biLM at `path`, in any format of `FORMATS`, or a bilm-tf
    model's two files as a pair (docs/models.md); anything else is refused
    with a `BiLMLoadError` that says what is there and what to point to.

    with_softmax: None loads the softmax head where the biLM has one (a biLM
        directory from pretraining); False leaves it out; True requires it.
    progress: wraps the names of the datasets or files as they are read.
    """
    kind, args = find_bilm(path)
    if kind == BILM_DIR:  # the one format with a softmax head
        return read_bilm_directory(*args, with_softmax=with_softmax)
    if with_softmax:
        raise BiLMLoadError(
            f"{args[0]} is {FORMATS[kind].name}, which has no softmax head (only the biLM "
            "directories that pretraining writes have one)"
        )
    return FORMATS[kind].read(*args, progress=progress)


def find_bilm(path: BiLMPath) -> tuple[str, tuple]:
    """(key in `FORMATS`, arguments of its `read`) of what `path` holds; else
    a `BiLMLoadError` saying what is there instead."""
    if isinstance(path, (tuple, list)):
        if len(path) != 2:
            raise BiLMLoadError(
                f"{path!r:.120} holds {len(path)} path{'' if len(path) == 1 else 's'}: a biLM "
                "is one path (a folder, an NLPL .zip), or a bilm-tf model's two files as a pair, "
                "(OPTIONS_JSON, WEIGHTS_HDF5)."
            )
        return BILM_TF_PAIR, tuple(path)
    if not isinstance(path, (str, os.PathLike)):
        raise BiLMLoadError(
            f"{path!r:.120} is of type {type(path).__name__}, not a biLM path: give a folder (a "
            "str or Path), or a bilm-tf model's two files as a pair, (OPTIONS_JSON, WEIGHTS_HDF5)."
        )
    path = existing(path)
    found = _found(path)
    if found is not None:
        return found
    if path.is_file():
        raise BiLMLoadError(_not_a_bilm(path))
    if any((path / name).is_file() for name in BILM_FILES):
        directory.check_bilm_directory(path)  # names what is missing
    raise BiLMLoadError(pretraining_message(path) or _not_a_bilm(path))


def read_bilm_tf_in(path: str | Path, progress: DatasetProgress = iter) -> BiLM:
    """The one bilm-tf model in the folder or NLPL .zip archive `path`."""
    path = existing(path)
    for kind in (BILM_TF, BILM_TF_ZIP):
        args = FORMATS[kind].find(path)
        if args:
            return FORMATS[kind].read(*args, progress=progress)
    if path.is_dir():
        raise BiLMLoadError(f"{path} holds no bilm-tf model: looked for {bilm_tf.PAIR_FILES}.")
    raise BiLMLoadError(f"{path} is a file, but not a zip archive: give a folder or a .zip.")


def layouts_help() -> str:
    """The accepted formats in one line, for help texts."""
    return "; ".join(format.name for format in FORMATS.values())


def _found(path: Path) -> tuple[str, tuple] | None:
    for kind, format in FORMATS.items():
        args = format.find and format.find(path)
        if args:
            return kind, args
    return None


def _holds_bilm(folder: Path) -> bool:
    """Whether `folder` holds a biLM, or several (a hint for error messages)."""
    try:
        return _found(folder) is not None
    except BiLMLoadError:
        return True
    except OSError:
        return False


def _not_a_bilm(path: Path) -> str:
    """What the file or folder `path` is instead of a biLM, and where one is nearby."""
    layouts = "; ".join(f"({i}) {f.name}: {f.files}" for i, f in enumerate(FORMATS.values(), 1))
    if path.is_dir():
        entries = sorted(path.iterdir())
        found = listing(p.name + ("/" if p.is_dir() else "") for p in entries) or "nothing"
        message = (
            f"{path} holds no biLM: {directory.CONFIG_FILE} is missing, and no bilm-tf options "
            f".json + weights .hdf5 pair was found. Accepted layouts: {layouts}. It holds: {found}."
        )
        inside = [p for p in entries[:50] if p.is_dir() and _holds_bilm(p)]
        if inside:
            message += " Point to " + " or ".join(str(p) for p in inside[:3]) + ", which holds one."
        return message
    if path.suffix.lower() == ".json" and bilm_tf.is_options_file(path):
        message = f"{path} is a bilm-tf options file, without its weights: {bilm_tf.GIVE_PAIR}"
    elif path.suffix.lower() in bilm_tf.WEIGHTS_SUFFIXES and bilm_tf.looks_like_weights(path):
        message = (
            f"{path} holds a bilm-tf model's weights, without its options: {bilm_tf.GIVE_PAIR}"
        )
    else:
        message = (
            f"{path} is a file, not a biLM: a biLM path is a folder, or an NLPL ELMo .zip "
            f"archive. Accepted layouts: {layouts}."
        )
    if _holds_bilm(path.parent):
        return message + f" Or point to the folder that holds it, {path.parent}."
    return message
