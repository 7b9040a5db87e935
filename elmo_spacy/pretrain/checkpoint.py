"""Pretraining checkpoints, written atomically (`RunFolder.point_to`), read
back exactly: `checkpoint-<step>/` holds the biLM (as `save_bilm` writes it),
`training_state.safetensors` (Adam's tensors and torch's random state) and
`progress.json` (the `RunState`)."""

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..bilm import BiLM, BiLMConfig, load_bilm
from ..bilm.formats.directory import (
    BILM_FILES,
    TOKENIZATION_FILE,
    BiLMLoadError,
    state_tensors,
    write_bilm_files,
)
from ..errors import ElmoSpacyError
from ..files import write_directory
from .config import PretrainConfig
from .run_folder import LATEST, PROGRESS_FILE, RunFolder

STATE_FILE = "training_state.safetensors"


@dataclass
class RunState:
    """Where a pretraining run is; saved in every checkpoint."""

    corpus: str = ""  # the fingerprint of the corpus (and dev corpus) trained on
    step: int = 0
    epoch: int = 1
    batch: int = 0  # batches of `epoch` done
    tokens: int = 0  # of text trained on, all epochs (see PretrainConfig.max_tokens)
    train_seconds: float = 0.0  # all runs (see PretrainConfig.max_hours)
    best: float = math.inf
    bad_evaluations: int = 0
    finished: bool = False
    epoch_tokens: int = 0  # predictions of one direction: each doc's tokens and its boundary
    epoch_text_tokens: int = 0
    epoch_nll: float = 0.0
    epoch_seconds: float = 0.0
    epochs: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    init_dev_perplexity: dict[str, float] | None = None  # of a biLM trained further
    loss_scale: dict[str, Any] | None = None  # the GradScaler's state, training in float16
    batching: dict[str, Any] = field(default_factory=dict)  # `batching_settings` of its config

    def next_epoch(self) -> None:
        self.epoch += 1
        self.batch = 0
        self.epoch_tokens, self.epoch_text_tokens = 0, 0
        self.epoch_nll, self.epoch_seconds = 0.0, 0.0


def save_checkpoint(
    run: RunFolder, bilm: BiLM, optimizer: torch.optim.Optimizer, state: RunState
) -> Path:
    """Write the checkpoint of `state.step` into the run folder and point to it."""
    final = run.checkpoint(state.step)
    bilm_state = state_tensors(bilm)
    optimizer_state = optimizer.state_dict()
    groups = optimizer_state["param_groups"]
    tensors = {
        f"optimizer.{index}.{name}": value.detach().cpu().contiguous()
        for index, values in optimizer_state["state"].items()
        for name, value in values.items()
    }
    tensors["torch_rng_state"] = torch.get_rng_state()

    def write(folder: Path) -> None:
        write_bilm_files(bilm, bilm_state, folder)
        save_file(tensors, str(folder / STATE_FILE))
        progress = {"progress": asdict(state), "param_groups": groups}
        (folder / PROGRESS_FILE).write_text(json.dumps(progress) + "\n")

    owned = (*BILM_FILES, TOKENIZATION_FILE, STATE_FILE, PROGRESS_FILE)
    write_directory(final, write, owned=owned)
    run.point_to(final)
    return final


def load_checkpoint(
    path: Path,
    bilm_config: BiLMConfig,
    config: PretrainConfig,
    device: torch.device = torch.device("cpu"),
) -> tuple[BiLM, torch.optim.Optimizer, RunState]:
    bilm = load_bilm(path).to(device)
    if bilm.config != bilm_config:
        raise ElmoSpacyError(
            f"{path} was trained with another [bilm] config; resume with the same config "
            "or start over in a new output directory."
        )
    bilm.train()
    saved = json.loads((path / PROGRESS_FILE).read_text())
    try:
        tensors = load_file(str(path / STATE_FILE))
    except (SafetensorError, OSError, ValueError) as err:
        raise BiLMLoadError(
            f"{path / STATE_FILE} is not a readable safetensors file ({err}). The checkpoint "
            f"is corrupt: delete {path.parent / LATEST} to start over."
        ) from err
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    groups = saved["param_groups"]
    for group in groups:
        group["betas"] = tuple(group["betas"])
    optimizer = new_optimizer(bilm, config)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    torch.set_rng_state(tensors["torch_rng_state"])
    return bilm, optimizer, RunState(**saved["progress"])


def new_optimizer(bilm: BiLM, config: PretrainConfig) -> torch.optim.Adam:
    """Adam over the biLM's parameters, fused where torch has a fused Adam for
    their device (CPU and CUDA): one pass over each tensor per step instead of
    one per operation, which counts for the word table, updated whole."""
    fused = next(bilm.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.Adam(bilm.parameters(), lr=config.learning_rate, fused=fused or None)
