"""The biLM training loop: Adam, gradient clipping, dev perplexity per epoch, early
stopping, and checkpoints that a killed run resumes from."""

import json
import math
import random
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..bilm import BiLM, BiLMConfig, WordVocab, save_bilm
from ..bilm.files import check_output_folder
from ..bilm.precision import resolve_precision
from ..errors import ElmoSpacyError
from .batching import Tokens, bucketed_batches, split_long
from .checkpoint import (
    LATEST,
    RunState,
    latest_checkpoint,
    load_checkpoint,
    new_optimizer,
    save_checkpoint,
)
from .config import PretrainConfig
from .distributed import Workers

LOG_FILE = "pretrain_log.json"
# What a run writes in its output folder (`elmo-spacy pretrain` adds the plot).
RUN_OUTPUTS = ("model-best", "model-last", LOG_FILE, LATEST, "perplexity.png")


class NotEnoughText(ElmoSpacyError):
    """The docs are too few to pretrain on (the message says how many are needed)."""


@dataclass
class Corpus:
    train: list[Tokens]
    dev: list[Tokens]
    dev_is_held_out: bool = True


@dataclass(kw_only=True)
class Pretraining:
    """One pretraining process: what stays fixed while it runs, the state it
    saves in checkpoints (`state`), and the steps of the loop."""

    bilm: BiLM
    optimizer: torch.optim.Optimizer
    loss: nn.Module  # ShardLoss, wrapped in DistributedDataParallel when distributed
    corpus: Corpus
    config: PretrainConfig
    rng: random.Random
    output_dir: Path
    workers: Workers
    show_progress: bool
    state: RunState

    def run(self) -> None:
        while self.state.epoch <= self.config.max_epochs and not self.state.finished:
            self.train_epoch()
            self.end_epoch()

    def train_epoch(self) -> None:
        """Train on the rest of the current epoch (from batch `state.batch`)."""
        bilm, config, state = self.bilm, self.config, self.state
        bilm.train()
        self.rng.setstate(state.epoch_rng)  # the epoch's batch order follows from it
        batches = list(bucketed_batches(self.corpus.train, config.batch_tokens, self.rng))
        bar = tqdm(
            total=len(batches),
            initial=state.batch,
            desc=f"epoch {state.epoch}",
            disable=not self.show_progress,
            unit="batch",
            mininterval=1.0,
        )
        for batch in batches[state.batch :]:
            started = time.perf_counter()
            shard = self.workers.shard(batch)
            batch_tokens = sum(len(doc) + 1 for doc in batch)
            # A rank left without docs still runs (on one doc, weighted 0): all ranks must sync.
            loss, nll = self.loss(shard or batch[:1], batch_tokens, 1.0 if shard else 0.0)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(bilm.parameters(), config.grad_clip)
            self.optimizer.step()
            state.epoch_seconds += time.perf_counter() - started
            state.step += 1
            state.batch += 1
            state.epoch_tokens += batch_tokens
            state.epoch_nll += self.workers.sum([nll.item()])[0]
            bar.update(1)
            bar.set_postfix(
                loss=f"{state.epoch_nll / state.epoch_tokens:.3f}",
                ppl=f"{perplexity(state.epoch_nll, state.epoch_tokens):.1f}",
                tok_s=f"{state.epoch_tokens / state.epoch_seconds:.0f}",
                refresh=False,
            )
            if config.max_steps and state.step >= config.max_steps:
                break
            if config.checkpoint_every and state.step % config.checkpoint_every == 0:
                self.save_checkpoint()
        bar.close()

    def end_epoch(self) -> None:
        """Measure dev perplexity, write model-last/model-best, decide whether to
        stop, move on to the next epoch and checkpoint."""
        bilm, config, state = self.bilm, self.config, self.state
        dev = evaluate_perplexity(bilm, self.corpus.dev, config.eval_batch_tokens, self.workers)
        state.epochs.append(
            {
                "epoch": state.epoch,
                "step": state.step,
                "train_tokens": state.epoch_tokens,
                "train_perplexity": perplexity(state.epoch_nll, state.epoch_tokens),
                "tokens_per_second": state.epoch_tokens / max(state.epoch_seconds, 1e-9),
                "dev_perplexity": dev,
            }
        )
        if self.workers.is_main:
            save_bilm(bilm, self.output_dir / "model-last")
        if dev["mean"] < state.best:
            state.best, state.bad_epochs = dev["mean"], 0
            if self.workers.is_main:
                save_bilm(bilm, self.output_dir / "model-best")
        else:
            state.bad_epochs += 1
        if self.show_progress:
            tqdm.write(
                f"epoch {state.epoch}: dev perplexity forward {dev['forward']:.1f}, "
                f"backward {dev['backward']:.1f}, mean {dev['mean']:.1f}; "
                f"{state.epochs[-1]['tokens_per_second']:.0f} tokens/s"
            )
        state.finished = bool(
            (config.patience and state.bad_epochs >= config.patience)
            or (config.max_steps and state.step >= config.max_steps)
        )
        state.next_epoch(self.rng.getstate())
        self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """Rank 0 writes the checkpoint; the others wait until it is in place."""
        if self.workers.is_main:
            save_checkpoint(self.output_dir, self.bilm, self.optimizer, self.state)
        self.workers.wait_for_all()


class ShardLoss(nn.Module):
    """The loss of one rank's share of a batch, scaled so that the gradients,
    averaged over ranks, are those of the whole batch's mean NLL per token.

    forward(batch, batch_tokens, weight) -> (scaled loss, summed NLL of the
    shard); `batch_tokens` counts the predictions of the whole batch, and
    `weight` 0 makes a rank that has no docs of this batch add nothing.
    DistributedDataParallel syncs gradients only through a module's forward.
    """

    def __init__(self, bilm: BiLM, world_size: int) -> None:
        super().__init__()
        self.bilm = bilm
        self.world_size = world_size

    def forward(
        self, docs: Sequence[Tokens], batch_tokens: int, weight: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss = self.bilm.lm_loss(self.bilm.batch(docs))
        nll = (loss.forward_nll + loss.backward_nll) * weight
        return nll * self.world_size / (2 * batch_tokens), nll.detach() / 2


def pretrain(
    docs: Sequence[Tokens],
    bilm_config: BiLMConfig,
    config: PretrainConfig,
    output_dir: Path,
    show_progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    init_vectors: Mapping[str, numpy.ndarray] | None = None,
    init_bilm: BiLM | None = None,
    workers: Workers | None = None,
) -> dict[str, Any]:
    """Train a biLM on tokenised docs. Writes to `output_dir`: `model-best/` and
    `model-last/` (biLM directories), `checkpoint-<step>/` every
    `checkpoint_every` steps and at each epoch's end, and `pretrain_log.json`.

    A seeded `dev_fraction` of the docs is held out for perplexity; with
    dev_fraction = 0 perplexity is measured on the training docs (held-in).
    With `resume`, training goes on from the latest checkpoint in `output_dir`
    (weights, Adam state, step, random states, position in the epoch) and ends
    with the same weights as an uninterrupted run on the CPU.
    An `output_dir` that holds an earlier run (see `check_output_dir`) is
    refused unless `resume` goes on from it or `overwrite` replaces it: the
    earlier run's outputs are removed before the new run starts.
    `init_vectors` (word -> vector of width word_dim) start the word encoder's
    embeddings of a fresh run (see `BiLM.init_word_vectors`).
    `init_bilm` (a pretrained biLM with its softmax head, of config
    `bilm_config`) is trained further on these docs instead of a fresh one (in
    place: the object passed is the one trained), its vocabulary kept: adapting
    it to the text of a task or domain, as bilm-tf's restart.py does. Its dev
    perplexity before the first step is logged as `init_dev_perplexity`.
    `workers` (from `start_workers`) places the biLM on a device and, under
    torchrun, trains data-parallel: each rank takes every world_size-th doc of
    each batch, and only rank 0 writes files. With dropout 0 this trains the
    same weights as one process (up to float rounding); with dropout, each rank
    draws its own masks.
    `config.precision` = "bfloat16" trains and measures dev perplexity under
    bfloat16 autocast (float32 with a warning where it does not pay); the
    weights, checkpoints and saved biLMs stay float32.
    Returns the log: settings, per-epoch perplexities, tokens/s, wall time.
    """
    started = time.perf_counter()
    workers = workers or Workers()
    output_dir = Path(output_dir)
    check_output_dir(output_dir, resume=resume, overwrite=overwrite)
    rng = random.Random(config.seed)
    corpus = _make_corpus(docs, config, rng)
    checkpoint = latest_checkpoint(output_dir) if resume else None
    initialised = None
    if init_bilm is not None:
        _check_init_bilm(init_bilm, bilm_config, init_vectors)
    if checkpoint is not None:
        bilm, optimizer, state = load_checkpoint(checkpoint, bilm_config, config, workers.device)
        if show_progress and workers.is_main:
            tqdm.write(f"Resuming from {checkpoint} (step {state.step}, epoch {state.epoch})")
    else:
        torch.manual_seed(config.seed)
        if init_bilm is not None:
            bilm = init_bilm
        else:
            vocab = WordVocab.build(
                corpus.train, max_size=bilm_config.max_vocab_size, min_count=bilm_config.min_count
            )
            bilm = BiLM(bilm_config, vocab)
        if init_vectors is not None:
            initialised = bilm.init_word_vectors(init_vectors)
        bilm.to(workers.device)
        optimizer = new_optimizer(bilm, config)
        state = RunState(epoch_rng=rng.getstate())
    with warnings.catch_warnings():
        if not workers.is_main:  # rank 0 says it for all: one fall-back warning, not one a rank
            warnings.simplefilter("ignore", RuntimeWarning)
        bilm.precision = resolve_precision(config.precision, workers.device, "[training] precision")
    if init_bilm is not None and checkpoint is None:
        init_dev = evaluate_perplexity(bilm, corpus.dev, config.eval_batch_tokens, workers)
        state.init_dev_perplexity = init_dev
        if show_progress and workers.is_main:
            tqdm.write(f"dev perplexity before training: mean {init_dev['mean']:.1f}")
    loss: nn.Module = ShardLoss(bilm, workers.world_size)
    if workers.distributed:
        torch.manual_seed(config.seed + 7919 * state.step + workers.rank)  # own dropout masks
        # Tail clusters of the adaptive softmax go unused on batches without their words.
        loss = DistributedDataParallel(loss, find_unused_parameters=True)
    if workers.is_main:  # only now: a run refused above leaves no folder behind
        if overwrite:
            remove_run(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
    Pretraining(
        bilm=bilm,
        optimizer=optimizer,
        loss=loss,
        corpus=corpus,
        config=config,
        rng=rng,
        output_dir=output_dir,
        workers=workers,
        show_progress=show_progress and workers.is_main,
        state=state,
    ).run()
    log = {
        "bilm": bilm_config.to_dict(),
        "training": config.to_dict(),
        "vocab_size": len(bilm.vocab),
        "words_from_init_vectors": initialised,
        "init_dev_perplexity": state.init_dev_perplexity,
        "train_docs": len(corpus.train),
        "train_tokens": sum(len(d) for d in corpus.train),
        "dev_docs": len(corpus.dev),
        "dev_is_held_out": corpus.dev_is_held_out,
        "world_size": workers.world_size,
        "precision": bilm.precision,
        "epochs": state.epochs,
        "best_dev_perplexity": state.best,
        "steps": state.step,
        "wall_seconds": time.perf_counter() - started,
        "resumed_from": str(checkpoint) if checkpoint is not None else None,
    }
    if workers.is_main:
        (output_dir / LOG_FILE).write_text(json.dumps(log, indent=2) + "\n")
    workers.wait_for_all()  # no rank leaves the process group while another still writes
    return log


def _check_init_bilm(
    bilm: BiLM, bilm_config: BiLMConfig, init_vectors: Mapping[str, numpy.ndarray] | None
) -> None:
    if bilm.softmax is None:
        raise ElmoSpacyError(
            "The biLM to train further has no softmax head (converted models and biLMs "
            "loaded with with_softmax=False have none): load a biLM that `elmo-spacy "
            "pretrain` wrote, with its softmax."
        )
    if bilm.config != bilm_config:
        raise ElmoSpacyError(
            "The biLM to train further has another [bilm] config than the one given: "
            "it keeps its own (pass its config, bilm.config)."
        )
    if init_vectors is not None:
        raise ElmoSpacyError(
            "Word vectors start a fresh biLM's embeddings; a biLM trained further keeps "
            "its own: give init_vectors or init_bilm, not both."
        )


def earlier_run(output_dir: Path) -> list[str]:
    """The names of what an earlier run left in `output_dir`, if anything."""
    if not output_dir.is_dir():
        return []
    return sorted(
        p.name for p in output_dir.iterdir() if p.name in RUN_OUTPUTS or _is_checkpoint(p.name)
    )


def check_output_dir(output_dir: Path, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse an output folder that cannot be made (see `check_output_folder`),
    or that would lose an earlier run: one that holds a run's outputs, unless
    `overwrite`, or with `resume`, a checkpoint to go on from."""
    if resume and overwrite:
        raise ElmoSpacyError("resume goes on from a run and overwrite replaces it: choose one.")
    check_output_folder(output_dir)
    found = earlier_run(output_dir)
    if overwrite or not found:
        return
    listed = ", ".join(found[:6]) + (", ..." if len(found) > 6 else "")
    if not resume:
        raise FileExistsError(
            f"{output_dir} holds an earlier pretraining run ({listed}). Resume it "
            "(--resume: go on from its latest checkpoint), replace it (--overwrite: its "
            "models, checkpoints and log are deleted), or choose another output folder."
        )
    if latest_checkpoint(output_dir) is None:
        raise FileExistsError(
            f"{output_dir} holds an earlier pretraining run ({listed}) but no "
            f"{LATEST} to resume from. Replace it (--overwrite: its models, checkpoints "
            "and log are deleted), or choose another output folder."
        )


def remove_run(output_dir: Path) -> None:
    """Delete what an earlier run left in `output_dir` (and nothing else)."""
    for name in earlier_run(output_dir):
        path = output_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _is_checkpoint(name: str) -> bool:
    return name.startswith("checkpoint-") and name[len("checkpoint-") :].isdigit()


def _make_corpus(docs: Sequence[Tokens], config: PretrainConfig, rng: random.Random) -> Corpus:
    docs = [d for d in docs if len(d)]
    if not docs:
        raise NotEnoughText(
            "no tokens to pretrain on: the text is empty or holds only blank lines."
        )
    if config.dev_fraction <= 0:
        train = split_long(docs, config.max_length)
        return Corpus(train, train, dev_is_held_out=False)
    n_dev = _dev_size(len(docs), config.dev_fraction)
    if n_dev >= len(docs):
        need = next(n for n in range(len(docs) + 1, 10**6) if _dev_size(n, config.dev_fraction) < n)
        raise NotEnoughText(
            f"{len(docs)} doc(s) (non-blank lines) are too few: [training] dev_fraction = "
            f"{config.dev_fraction} holds out {n_dev} for dev perplexity, which leaves none to "
            f"train on. Give at least {need} docs, or set dev_fraction = 0 "
            "(--training.dev_fraction 0) to measure perplexity on the training docs."
        )
    order = list(range(len(docs)))
    rng.shuffle(order)
    dev = set(order[:n_dev])
    train = [d for i, d in enumerate(docs) if i not in dev]
    dev_docs = [docs[i] for i in sorted(dev)]
    return Corpus(split_long(train, config.max_length), split_long(dev_docs, config.max_length))


def _dev_size(n_docs: int, dev_fraction: float) -> int:
    """How many of `n_docs` docs a dev_fraction > 0 holds out: at least one."""
    return max(1, int(round(n_docs * dev_fraction)))


def perplexity(nll: float, n_tokens: int) -> float:
    """exp(mean NLL per token), capped so that an early, huge loss does not overflow."""
    return math.exp(min(nll / max(n_tokens, 1), 50))


@torch.inference_mode()
def evaluate_perplexity(
    bilm: BiLM, docs: Sequence[Tokens], batch_tokens: int = 8000, workers: Workers | None = None
) -> dict[str, float]:
    """Exact perplexity of `docs` per direction and their geometric mean.
    Every word and the closing (forwards) or opening (backwards) boundary counts.
    With `workers`, each rank scores its share of the batches."""
    workers = workers or Workers()
    was_training = bilm.training
    bilm.eval()
    forward, backward, n_tokens = 0.0, 0.0, 0
    batches = list(bucketed_batches(docs, batch_tokens, random.Random(0), shuffle=False))
    for batch in workers.shard(batches):
        loss = bilm.lm_loss(bilm.batch(batch))
        forward += float(loss.forward_nll)
        backward += float(loss.backward_nll)
        n_tokens += loss.n_tokens
    bilm.train(was_training)
    forward, backward, n_tokens = workers.sum([forward, backward, n_tokens])
    return {
        "forward": perplexity(forward, n_tokens),
        "backward": perplexity(backward, n_tokens),
        "mean": perplexity(forward + backward, 2 * n_tokens),
    }
