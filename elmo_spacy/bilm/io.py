"""A biLM on disk: `config.json`, `vocab.json` and `weights.safetensors`.

safetensors holds raw tensors only, so loading a biLM never unpickles
anything. Pretraining writes this layout and the `elmo` pipe reads it.
"""

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save, save_file

from .bilm_tf import find_bilm_tf, read_bilm_tf
from .config import BiLMConfig
from .files import write_directory
from .model import BiLM
from .precision import check_precision
from .vocab import WordVocab

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
WEIGHTS_FILE = "weights.safetensors"
BILM_FILES = (CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE)


class BiLMLoadError(ValueError):
    """A biLM directory or payload that cannot be loaded, with the reason."""


def save_bilm(bilm: BiLM, path: str | Path, extra_files: Collection[str] = ()) -> Path:
    """Write `bilm` to the directory `path`, all at once (see `write_directory`:
    an existing biLM directory there is replaced, anything else is refused).
    `extra_files`: names of other files the caller writes into the directory
    afterwards, which an existing directory may also hold."""
    state = state_tensors(bilm)

    def write(folder: Path) -> None:
        write_bilm_files(bilm, state, folder)

    return write_directory(path, write, owned=(*BILM_FILES, *extra_files))


def write_bilm_files(bilm: BiLM, state: dict[str, torch.Tensor], folder: Path) -> None:
    """The three files of a biLM directory, into an existing `folder`."""
    (folder / CONFIG_FILE).write_text(json.dumps(bilm.config.to_dict(), indent=2) + "\n")
    # ASCII with \u escapes: a word may hold a lone surrogate, which UTF-8 cannot.
    (folder / VOCAB_FILE).write_text(json.dumps(bilm.vocab.words) + "\n", encoding="utf-8")
    save_file(state, str(folder / WEIGHTS_FILE))


def load_bilm(
    path: str | Path, with_softmax: bool | None = None, precision: str = "float32"
) -> BiLM:
    """Read a biLM directory written by `save_bilm`, or a folder that holds a
    bilm-tf model (`options.json` + `weights.hdf5`, or `*_options.json` +
    `*_weights.hdf5`; see `elmo_spacy.bilm.bilm_tf`).

    with_softmax: None loads the softmax head where the directory has one;
        False leaves it out (the `elmo` pipe does not need it); True requires it.
    precision: what the biLM computes in, "float32" or "bfloat16" (see
        `BiLM.precision`); the weights are float32 either way.
    """
    check_precision(precision, "load_bilm: precision")
    bilm = _load_bilm(Path(path), with_softmax)
    bilm.precision = precision
    return bilm


def _load_bilm(path: Path, with_softmax: bool | None) -> BiLM:
    if path.is_dir() and not (path / CONFIG_FILE).exists():
        pair = find_bilm_tf(path)
        if pair is not None:
            if with_softmax:
                raise BiLMLoadError(f"{path} holds a bilm-tf model, which has no softmax head")
            return read_bilm_tf(*pair)
    for name in BILM_FILES:
        if not (path / name).is_file():
            raise BiLMLoadError(
                f"{path} is not a biLM directory: {name} is missing. Point to the output of "
                "`elmo-spacy pretrain` (e.g. training/bilm/model-best) or `elmo-spacy "
                "convert-elmo`, or to a folder with a bilm-tf options.json and weights.hdf5."
            )
    config = _read_json(path / CONFIG_FILE)
    words = _read_json(path / VOCAB_FILE)
    try:
        weights = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as err:
        raise BiLMLoadError(
            f"{path / WEIGHTS_FILE} is not a readable safetensors file ({err}). "
            "It may be truncated or corrupt: copy or pretrain it again."
        ) from err
    return _build(config, words, weights, with_softmax, where=str(path))


def bilm_to_bytes(bilm: BiLM) -> dict[str, Any]:
    """A msgpack-ready payload of the biLM (config, vocab, safetensors bytes)."""
    return {
        "config": bilm.config.to_dict(),
        "vocab": bilm.vocab.words,
        "weights": save(state_tensors(bilm)),
    }


def bilm_from_bytes(payload: dict[str, Any], with_softmax: bool | None = None) -> BiLM:
    try:
        weights = load(payload["weights"])
    except (SafetensorError, ValueError) as err:
        raise BiLMLoadError(f"The serialised biLM weights are corrupt ({err})") from err
    return _build(payload["config"], payload["vocab"], weights, with_softmax, where="bytes")


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
    try:
        bilm = BiLM(BiLMConfig.from_dict(config), WordVocab(words), with_softmax=with_softmax)
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
            f"{where} holds a biLM without its softmax head (as saved by the elmo pipe): "
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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise BiLMLoadError(f"{path} is not valid JSON: {err}") from err
