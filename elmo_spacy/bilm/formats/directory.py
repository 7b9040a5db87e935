"""This package's own format: a biLM directory of `config.json`, `vocab.json`
and `weights.safetensors`, and `tokenization.json` where it is known how its
text was tokenised. Pretraining, the converters and the `elmo`
pipe write it. `vocab.json` is the list of words, or with a character
vocabulary {"words": [...], "chars": [...]}; `tokenization.json` a
`Tokenization`. safetensors holds raw tensors: nothing is unpickled.
"""

import json
from collections.abc import Collection
from functools import partial
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
from .checks import BiLMLoadError, are_missing, check_shapes, existing, read_json

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
WEIGHTS_FILE = "weights.safetensors"
BILM_FILES = (CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE)
TOKENIZATION_FILE = "tokenization.json"  # how its text was tokenised, where known
PRETRAIN_OUTPUTS = ("model-best", "model-last")


def save_bilm(bilm: BiLM, path: str | Path, extra_files: Collection[str] = ()) -> Path:
    """Write `bilm` to the directory `path`, all at once (`write_directory`).
    `extra_files`: other files the caller writes there afterwards."""
    write = partial(write_bilm_files, bilm, state_tensors(bilm))
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


def read_bilm_directory(folder: str | Path, with_softmax: bool | None = None) -> BiLM:
    """The biLM in the biLM directory `folder`; `with_softmax` as `load_bilm`'s."""
    folder = existing(folder)
    check_bilm_directory(folder)
    config = read_json(folder / CONFIG_FILE, BiLMLoadError)
    words = read_json(folder / VOCAB_FILE, BiLMLoadError)
    try:
        weights = load_file(str(folder / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as err:
        raise BiLMLoadError(
            f"{folder / WEIGHTS_FILE} is not a readable safetensors file ({err}). "
            "It may be truncated or corrupt: copy or pretrain it again."
        ) from err
    bilm = _build(config, words, weights, with_softmax, where=str(folder))
    if (folder / TOKENIZATION_FILE).is_file():
        tokenization = read_json(folder / TOKENIZATION_FILE, BiLMLoadError)
        bilm.tokenization = _tokenization(tokenization, folder)
    return bilm


def check_bilm_directory(folder: Path) -> None:
    """Nothing, if `folder` holds the files of a biLM directory; else a
    `BiLMLoadError` that names the missing files, or, for the folder that
    `elmo-spacy pretrain` writes, the biLM in it to point to instead."""
    missing = [name for name in BILM_FILES if not (folder / name).is_file()]
    if not missing:
        return
    if len(missing) < len(BILM_FILES):
        present = [name for name in BILM_FILES if name not in missing]
        raise BiLMLoadError(
            f"{folder} is an incomplete biLM directory: {are_missing(missing)} (it holds "
            f"{', '.join(present)}). Copy the whole folder that `elmo-spacy pretrain` or "
            "`convert-elmo` wrote."
        )
    raise BiLMLoadError(
        pretraining_message(folder)
        or f"{folder} is not a biLM directory: it has none of {', '.join(BILM_FILES)}."
    )


def pretraining_message(folder: Path) -> str | None:
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
    """What vocab.json holds: the words, and the characters of a char vocabulary."""
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
    expected = {k: tuple(v.shape) for k, v in bilm.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in weights.items()}
    missing = expected.keys() - found.keys()
    if found.items() < expected.items() and all(k.startswith("softmax.") for k in missing):
        raise BiLMLoadError(
            f"{where} holds a biLM without its softmax head (the elmo pipe saves none, and "
            "published models come without one): "
            "load it with with_softmax=False, or use the pretraining output to go on pretraining."
        )
    check_shapes(
        found,
        expected,
        where=f"{WEIGHTS_FILE} in {where}",
        described_by="the model its config.json and vocab.json describe",
        error=BiLMLoadError,
        unexpected=True,
    )
    bilm.load_state_dict(weights)
    bilm.eval()
    return bilm
