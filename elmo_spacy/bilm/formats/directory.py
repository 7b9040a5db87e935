"""A biLM on disk: `config.json`, `vocab.json` and `weights.safetensors`, and
`tokenization.json` where it is known how its text was tokenised.

`vocab.json` is the list of words, or, for a biLM with a character
vocabulary (a converted ELMoForManyLangs model), {"words": [...], "chars": [...]}.
`tokenization.json` is a `Tokenization` ({"tokenizer": "spacy", "lang": "en"}).

safetensors holds raw tensors only, so loading a biLM never unpickles
anything. Pretraining writes this layout and the `elmo` pipe reads it;
`load_bilm` also reads the bilm-tf layouts that `locate` finds (published,
AllenNLP and NLPL ELMo models, folders or .zip archives, or a model's two
files given as a pair) and ELMoForManyLangs folders.
"""

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save, save_file

from ...files import write_directory
from ..bilm import BiLM
from ..inputs.tokenization import Tokenization
from ..inputs.vocab import WordVocab
from ..model.config import BiLMConfig
from .bilm_tf import DatasetProgress, read_bilm_tf
from .checks import read_json
from .efml import read_efml
from .locate import (
    BILM_DIR,
    BILM_FILES,
    BILM_TF,
    BILM_TF_PAIR,
    BILM_TF_ZIP,
    CONFIG_FILE,
    EFML,
    TOKENIZATION_FILE,
    VOCAB_FILE,
    BiLMLoadError,
    BiLMLocation,
    BiLMPath,
    bilm_tf_files,
    resolve_bilm_path,
)
from .locate import SAFETENSORS_FILE as WEIGHTS_FILE


def save_bilm(bilm: BiLM, path: str | Path, extra_files: Collection[str] = ()) -> Path:
    """Write `bilm` to the directory `path`, all at once (see `write_directory`:
    an existing biLM directory there is replaced, anything else is refused).
    `extra_files`: names of other files the caller writes into the directory
    afterwards, which an existing directory may also hold."""
    state = state_tensors(bilm)

    def write(folder: Path) -> None:
        write_bilm_files(bilm, state, folder)

    return write_directory(path, write, owned=(*BILM_FILES, TOKENIZATION_FILE, *extra_files))


def write_bilm_files(bilm: BiLM, state: dict[str, torch.Tensor], folder: Path) -> None:
    """The files of a biLM directory, into an existing `folder`: its config,
    vocabulary and weights, and its tokenisation where it is known."""
    (folder / CONFIG_FILE).write_text(json.dumps(bilm.config.to_dict(), indent=2) + "\n")
    # ASCII with \u escapes: a word may hold a lone surrogate, which UTF-8 cannot.
    (folder / VOCAB_FILE).write_text(json.dumps(vocab_json(bilm)) + "\n", encoding="utf-8")
    save_file(state, str(folder / WEIGHTS_FILE))
    if bilm.tokenization is not None:
        (folder / TOKENIZATION_FILE).write_text(
            json.dumps(bilm.tokenization.to_dict(), indent=2) + "\n"
        )


def load_bilm(path: BiLMPath, with_softmax: bool | None = None) -> BiLM:
    """Read the biLM at `path`, in any layout of
    `elmo_spacy.bilm.formats.locate.LAYOUTS`: a biLM directory written by
    `save_bilm` (`elmo-spacy pretrain`'s model-best/, `convert-elmo`'s
    output), a bilm-tf model folder (the published ELMo files, AllenNLP's,
    NLPL's), an NLPL .zip archive, or an ELMoForManyLangs model folder; or a
    bilm-tf model's two files as a pair, `(options_json, weights_hdf5)` (a
    2-tuple or list of paths or strings, of any names in any folders, as
    AllenNLP's `Elmo(options_file, weight_file, ...)` takes them):

        load_bilm("models/elmo-original")
        load_bilm(("downloads/elmo_options.json", "weights/elmo_weights.hdf5"))

    Any other path (an options file alone, too) is refused with a
    `BiLMLoadError` that says what is there and what to point to.

    with_softmax: None loads the softmax head where the directory has one;
        False leaves it out (the `elmo` pipe does not need it); True requires it.

    The biLM computes in float32 until told otherwise (`BiLM.precision`).
    """
    return load_bilm_at(resolve_bilm_path(path), with_softmax)


def load_bilm_at(
    location: BiLMLocation, with_softmax: bool | None = None, progress: DatasetProgress = iter
) -> BiLM:
    """Read the biLM that `resolve_bilm_path` (or `bilm_tf_pair`) found.
    `progress` wraps the names of a bilm-tf model's datasets as they are read."""
    if location.kind == BILM_DIR:
        return _load_directory(location.path, with_softmax)
    if with_softmax:
        raise BiLMLoadError(
            f"{location.describe()} has no softmax head (converted models have none)"
        )
    return READERS[location.kind](location, progress)


def _read_bilm_tf(location: BiLMLocation, progress: DatasetProgress) -> BiLM:
    with bilm_tf_files(location) as files:
        return read_bilm_tf(*files, progress, names=location.file_names())


# How each layout of `locate.LAYOUTS` but the biLM directory is read:
# (location, progress) -> BiLM, without a softmax head.
READERS = {
    BILM_TF: _read_bilm_tf,
    BILM_TF_PAIR: _read_bilm_tf,
    BILM_TF_ZIP: _read_bilm_tf,
    EFML: lambda location, progress: read_efml(location.path),
}


def _load_directory(path: Path, with_softmax: bool | None) -> BiLM:
    config = read_json(path / CONFIG_FILE, BiLMLoadError)
    words = read_json(path / VOCAB_FILE, BiLMLoadError)
    try:
        weights = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as err:
        raise BiLMLoadError(
            f"{path / WEIGHTS_FILE} is not a readable safetensors file ({err}). "
            "It may be truncated or corrupt: copy or pretrain it again."
        ) from err
    bilm = _build(config, words, weights, with_softmax, where=str(path))
    if (path / TOKENIZATION_FILE).is_file():
        bilm.tokenization = _tokenization(read_json(path / TOKENIZATION_FILE, BiLMLoadError), path)
    return bilm


def bilm_to_bytes(bilm: BiLM) -> dict[str, Any]:
    """A msgpack-ready payload of the biLM (config, vocab, safetensors bytes)."""
    return {
        "config": bilm.config.to_dict(),
        "vocab": vocab_json(bilm),
        "weights": save(state_tensors(bilm)),
        "tokenization": None if bilm.tokenization is None else bilm.tokenization.to_dict(),
    }


def bilm_from_bytes(payload: dict[str, Any], with_softmax: bool | None = None) -> BiLM:
    try:
        weights = load(payload["weights"])
    except (SafetensorError, ValueError) as err:
        raise BiLMLoadError(f"The serialised biLM weights are corrupt ({err})") from err
    bilm = _build(payload["config"], payload["vocab"], weights, with_softmax, where="bytes")
    if payload.get("tokenization") is not None:
        bilm.tokenization = _tokenization(payload["tokenization"], "bytes")
    return bilm


def _tokenization(values: Any, where: Any) -> Tokenization:
    try:
        return Tokenization.from_dict(values)
    except ValueError as err:
        raise BiLMLoadError(f"{where}: {err}") from err


def vocab_json(bilm: BiLM) -> list[str] | dict[str, list[str]]:
    """What vocab.json holds: the words, and the characters if the biLM has a
    character vocabulary."""
    if bilm.char_vocab is None:
        return bilm.vocab.words
    return {"words": bilm.vocab.words, "chars": bilm.char_vocab}


def state_tensors(bilm: BiLM) -> dict[str, torch.Tensor]:
    """The biLM's weights as contiguous CPU tensors, ready for safetensors."""
    return {k: v.detach().cpu().contiguous() for k, v in bilm.state_dict().items()}


def _build(
    config: dict[str, Any],
    words: Any,
    weights: dict[str, torch.Tensor],
    with_softmax: bool | None,
    where: str,
) -> BiLM:
    if with_softmax is None:
        with_softmax = any(k.startswith("softmax.") for k in weights)
    chars = None
    if isinstance(words, dict):
        words, chars = words.get("words"), words.get("chars")
    try:
        bilm = BiLM(
            BiLMConfig.from_dict(config),
            WordVocab(words),
            with_softmax=with_softmax,
            char_vocab=chars,
        )
    except (TypeError, ValueError) as err:
        raise BiLMLoadError(f"Invalid biLM config or vocab in {where}: {err}") from err
    if not with_softmax:
        weights = {k: v for k, v in weights.items() if not k.startswith("softmax.")}
    expected = bilm.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong_shape = [
        f"{k}: file {tuple(v.shape)} vs config {tuple(expected[k].shape)}"
        for k, v in weights.items()
        if k in expected and v.shape != expected[k].shape
    ]
    if (
        missing
        and all(k.startswith("softmax.") for k in missing)
        and not (unexpected or wrong_shape)
    ):
        raise BiLMLoadError(
            f"{where} holds a biLM without its softmax head (the elmo pipe saves none, and "
            "published models come without one): "
            "load it with with_softmax=False, or use the pretraining output to go on pretraining."
        )
    if missing or unexpected or wrong_shape:
        raise BiLMLoadError(
            f"The weights in {where} do not match its config.json and vocab.json "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"shape mismatches {wrong_shape[:5]}). Were files from different runs mixed?"
        )
    bilm.load_state_dict(weights)
    bilm.eval()
    return bilm
