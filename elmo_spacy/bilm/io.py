"""A biLM on disk: `config.json`, `vocab.json` and `weights.safetensors`.

safetensors holds raw tensors only, so loading a biLM never unpickles
anything. Pretraining writes this layout and the `elmo` pipe reads it.
"""

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save, save_file

from .config import BiLMConfig
from .model import BiLM
from .vocab import WordVocab

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
WEIGHTS_FILE = "weights.safetensors"


class BiLMLoadError(ValueError):
    """A biLM directory or payload that cannot be loaded, with the reason."""


def save_bilm(bilm: BiLM, path: str | Path) -> Path:
    """Write `bilm` to the directory `path` (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps(bilm.config.to_dict(), indent=2) + "\n")
    (path / VOCAB_FILE).write_text(json.dumps(bilm.vocab.words, ensure_ascii=False) + "\n")
    save_file(_state(bilm), str(path / WEIGHTS_FILE))
    return path


def load_bilm(path: str | Path, with_softmax: bool = True) -> BiLM:
    """Read a biLM directory written by `save_bilm`. With `with_softmax=False`
    the softmax head is left out (the `elmo` pipe does not need it)."""
    path = Path(path)
    for name in (CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise BiLMLoadError(
                f"{path} is not a biLM directory: {name} is missing. Point to the "
                "output of `elmo-spacy pretrain` (e.g. training/bilm/model-best)."
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
        "weights": save(_state(bilm)),
    }


def bilm_from_bytes(payload: dict[str, Any], with_softmax: bool = True) -> BiLM:
    try:
        weights = load(payload["weights"])
    except (SafetensorError, ValueError) as err:
        raise BiLMLoadError(f"The serialised biLM weights are corrupt ({err})") from err
    return _build(payload["config"], payload["vocab"], weights, with_softmax, where="bytes")


def _state(bilm: BiLM) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in bilm.state_dict().items()}


def _build(
    config: dict[str, Any],
    words: Any,
    weights: dict[str, torch.Tensor],
    with_softmax: bool,
    where: str,
) -> BiLM:
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
