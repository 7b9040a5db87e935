"""The biLM training loop: Adam, gradient clipping, dev perplexity at epoch ends
(and every `eval_every` steps), budgets of steps, tokens and hours, early
stopping, and checkpoints that a killed run resumes from."""

import itertools
import json
import math
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..bilm import BiLM, BiLMConfig, TokenBatch, load_bilm, save_bilm
from ..bilm.inputs.buckets import ShapeBuckets
from ..errors import ElmoSpacyError
from .batches import (
    BatchBuilder,
    DevSample,
    NotEnoughText,
    Pieces,
    Prefetcher,
    corpus_vocabulary,
    dev_sample,
    epoch_batches,
    ordered_batches,
)
from .checkpoint import RunState, load_checkpoint, new_optimizer, save_checkpoint
from .config import PretrainConfig
from .corpus import Corpus, CorpusCheck
from .distributed import Workers
from .limits import limits_reached
from .memory import keep_freed_memory, release_freed_memory
from .prepare import open_corpus
from .run_folder import RunFolder

__all__ = ["NotEnoughText", "ShareLoss", "evaluate_perplexity", "pretrain", "training_step"]


@dataclass
class TrainingData:
    """What a run trains on and measures: the corpus, the dev sample and its
    batches, and a `BatchBuilder` for each."""

    corpus: Corpus
    dev: DevSample
    dev_batches: list[Pieces]
    build: BatchBuilder
    build_dev: BatchBuilder
    epoch_tokens: int  # of text trained on in an epoch
    dev_tokens: int  # of the dev sample


@dataclass(kw_only=True)
class Pretraining:
    """One pretraining process: what stays fixed while it runs, the state it
    saves in checkpoints (`state`), and the steps of the loop."""

    bilm: BiLM
    optimizer: torch.optim.Optimizer
    loss: nn.Module  # ShareLoss, wrapped in DistributedDataParallel when distributed
    data: TrainingData
    config: PretrainConfig
    folder: RunFolder
    workers: Workers
    show_progress: bool
    state: RunState
    started: float  # time.perf_counter() when pretrain() began
    scaler: torch.amp.GradScaler | None = None  # training in float16
    corpus_check: CorpusCheck | None = None  # rank 0's check of the files read
    first_step: float | None = None  # seconds from `started` to the first step
    _pending_nll: torch.Tensor | None = None
    _clock: float = field(default_factory=time.perf_counter)

    def run(self) -> None:
        while not self.state.finished:
            self.train_epoch()

    def train_epoch(self) -> None:
        """Train on the rest of the current epoch (from batch `state.batch`),
        or until a budget is spent or patience runs out; then end the epoch."""
        bilm, config, state = self.bilm, self.config, self.state
        bilm.train()
        planned = epoch_batches(
            self.data.corpus,
            seed=config.seed,
            epoch=state.epoch,
            max_length=config.max_length,
            batch_tokens=config.batch_tokens,
            exclude=self.data.dev.excluded_from(self.data.corpus),
            buckets=self.data.build.buckets,
        )
        bar = tqdm(
            total=self.data.epoch_tokens,
            initial=state.epoch_text_tokens,
            desc=f"epoch {state.epoch}",
            disable=not self.show_progress,
            unit="tok",
            unit_scale=True,
            mininterval=1.0,
        )
        self._pending_nll = torch.zeros((), device=self.workers.device)
        self._clock = time.perf_counter()
        stopped = False
        with Prefetcher(
            itertools.islice(planned, state.batch, None), self.data.build, self.workers
        ) as batches:
            for batch, pieces, weight in batches:
                if self.first_step is None:
                    self.first_step = time.perf_counter() - self.started
                if self.corpus_check is not None:
                    self.corpus_check.raise_if_failed()
                nll = training_step(
                    self.loss,
                    self.optimizer,
                    config.grad_clip,
                    batch,
                    pieces.predictions,
                    weight,
                    scaler=self.scaler,
                )
                self._pending_nll += nll
                state.step += 1
                state.batch += 1
                state.epoch_tokens += pieces.predictions
                state.epoch_text_tokens += pieces.tokens
                state.tokens += pieces.tokens
                bar.update(pieces.tokens)
                stopped = bool(limits_reached(state, config, at="step"))
                if state.step % config.log_every == 0 or stopped:
                    stopped = self.flush() or stopped  # the hours, agreed by every rank
                    bar.set_postfix(
                        ppl=f"{perplexity(state.epoch_nll, state.epoch_tokens):.1f}",
                        tok_s=f"{state.epoch_tokens / max(state.epoch_seconds, 1e-9):.0f}",
                        refresh=False,
                    )
                if stopped:
                    break
                if config.eval_every and state.step % config.eval_every == 0:
                    self.evaluate()
                    if state.finished:  # patience ran out
                        break
                if config.checkpoint_every and state.step % config.checkpoint_every == 0:
                    self.save_checkpoint()
        bar.close()
        self.end_epoch(stopped)

    def flush(self) -> bool:
        """Bring the figures kept on the device to the host (one wait, one
        collective): the NLL summed since the last flush, over all ranks, and
        the training time. Returns whether a limit checked here (the hours)
        is reached on any rank, so that all stop at the same step."""
        now = time.perf_counter()
        self.state.epoch_seconds += now - self._clock
        self.state.train_seconds += now - self._clock
        over = bool(limits_reached(self.state, self.config, at="flush"))
        nll, over_anywhere = self.workers.sum([self._pending_nll, float(over)])
        self.state.epoch_nll += nll
        self._pending_nll.zero_()
        self._clock = time.perf_counter()
        return over_anywhere > 0

    def evaluate(self) -> None:
        """Measure dev perplexity, write model-last/ and, if it is the best
        yet, model-best/, and count the evaluations without a better one."""
        bilm, config, state = self.bilm, self.config, self.state
        self.flush()
        dev = evaluate_perplexity(
            bilm,
            (self.data.build_dev(p) for p in self.workers.share(self.data.dev_batches)),
            self.workers,
        )
        bilm.train()
        state.evaluations.append(
            {
                "step": state.step,
                "epoch": state.epoch,
                "tokens": state.tokens,
                "train_perplexity": perplexity(state.epoch_nll, state.epoch_tokens),
                "dev_perplexity": dev,
            }
        )
        self.corpus_whole()
        if self.workers.is_main:
            save_bilm(bilm, self.folder.model_last)
        if dev["mean"] < state.best:
            state.best, state.bad_evaluations = dev["mean"], 0
            if self.workers.is_main:
                save_bilm(bilm, self.folder.model_best)
        else:
            state.bad_evaluations += 1
        if limits_reached(state, config, at="evaluation"):
            state.finished = True
        if self.show_progress:
            tqdm.write(
                f"step {state.step} (epoch {state.epoch}): dev perplexity forward "
                f"{dev['forward']:.1f}, backward {dev['backward']:.1f}, mean {dev['mean']:.1f}"
            )
        self._clock = time.perf_counter()

    def end_epoch(self, stopped: bool) -> None:
        """At an epoch's end, or where a budget stopped it: measure dev
        perplexity (unless just done), log the epoch, decide whether to go
        on, move on to the next epoch and checkpoint."""
        state = self.state
        stopped = self.flush() or stopped
        if not state.evaluations or state.evaluations[-1]["step"] != state.step:
            self.evaluate()
        state.epochs.append(
            {
                "epoch": state.epoch,
                "step": state.step,
                "train_tokens": state.epoch_tokens,
                "train_perplexity": perplexity(state.epoch_nll, state.epoch_tokens),
                "tokens_per_second": state.epoch_tokens / max(state.epoch_seconds, 1e-9),
                "dev_perplexity": state.evaluations[-1]["dev_perplexity"],
            }
        )
        if self.show_progress:
            tqdm.write(f"epoch {state.epoch}: {state.epochs[-1]['tokens_per_second']:.0f} tokens/s")
        state.next_epoch()
        reached = limits_reached(state, self.config, at="epoch")
        state.finished = state.finished or stopped or bool(reached)
        self.save_checkpoint()

    def corpus_whole(self) -> None:
        """Wait for the check of the corpus's files (the first time), and stop
        the run if one is damaged: nothing trained on it is written."""
        if self.corpus_check is not None:
            self.corpus_check.wait()

    def save_checkpoint(self) -> None:
        """Rank 0 writes the checkpoint; the others wait until it is in place."""
        self.flush()
        if self.scaler is not None:
            self.state.loss_scale = self.scaler.state_dict()
        self.corpus_whole()
        if self.workers.is_main:
            save_checkpoint(self.folder, self.bilm, self.optimizer, self.state)
        self.workers.wait_for_all()
        self._clock = time.perf_counter()


def training_step(
    loss: nn.Module,
    optimizer: torch.optim.Optimizer,
    grad_clip: float,
    batch: TokenBatch,
    batch_tokens: int,
    weight: float = 1.0,
    mark: Callable[[str], None] | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """One optimizer step on one rank's share of a batch: the loss (a
    `ShareLoss`, or its DistributedDataParallel), its gradients, clipped to
    `grad_clip`, and Adam's update. Returns the share's summed NLL, a tensor
    on the device (read it, and wait for the device, only when needed).
    `mark(phase)` is called after each phase, "forward", "backward" and
    "optimizer" (for benchmarks that time them). `scaler` (training in
    float16): the loss is scaled before the backward pass, the gradients
    unscaled before clipping, and a step whose gradients overflowed is
    skipped (which waits for the device)."""
    mark = mark or _no_mark
    scaled, nll = loss(batch, batch_tokens, weight)
    mark("forward")
    optimizer.zero_grad()
    parameters = optimizer.param_groups[0]["params"]
    if scaler is None:
        scaled.backward()
        mark("backward")
        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        optimizer.step()
    else:
        scaler.scale(scaled).backward()
        mark("backward")
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        scaler.step(optimizer)
        scaler.update()
    mark("optimizer")
    return nll


def _no_mark(phase: str) -> None:
    pass


class ShareLoss(nn.Module):
    """The loss of one rank's share of a batch, scaled so that the gradients,
    averaged over ranks, are those of the whole batch's mean NLL per token.

    forward(batch, batch_tokens, weight) -> (scaled loss, summed NLL of the
    share, a tensor on the device); `batch_tokens` counts the predictions of
    the whole batch, and `weight` 0 makes a rank that has no docs of this
    batch add nothing. DistributedDataParallel syncs gradients only through a
    module's forward. The two factors reach the device as a tensor, not as
    numbers in the operators' arguments, so that steps on batches of one
    shape run the same operators with the same arguments (what a captured
    step replays).
    """

    def __init__(self, bilm: BiLM, world_size: int) -> None:
        super().__init__()
        self.bilm = bilm
        self.world_size = world_size

    def forward(
        self, batch: TokenBatch, batch_tokens: int, weight: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.bilm.parameters()).device
        on_gpu = device.type == "cuda"
        batch = batch.to(device, non_blocking=on_gpu)  # from pinned memory
        factors = self.factors(batch_tokens, weight, pinned=on_gpu)
        return self.scaled(batch, factors.to(device, non_blocking=on_gpu))

    def factors(self, batch_tokens: int, weight: float, pinned: bool = False) -> torch.Tensor:
        """(2,) float32 on the host (in page-locked memory where `pinned`):
        what the summed NLL of a share is multiplied by for the scaled loss,
        and for the NLL reported."""
        factors = torch.tensor([weight * self.world_size / (2 * batch_tokens), weight / 2])
        return factors.pin_memory() if pinned else factors

    def scaled(self, batch: TokenBatch, factors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s results for a batch and `factors` on the biLM's device."""
        loss = self.bilm.lm_loss(batch)
        nll = loss.forward_nll + loss.backward_nll
        return nll * factors[0], nll.detach() * factors[1]


def pretrain(
    corpus: Corpus | Sequence[str | Path],
    bilm_config: BiLMConfig | None,
    config: PretrainConfig,
    output_dir: str | Path,
    *,
    dev: Corpus | Sequence[str | Path] | None = None,
    lang: str | None = None,
    pretokenized: bool = False,
    show_progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    init_vectors: Mapping[str, numpy.ndarray] | str | Path | None = None,
    init_bilm: BiLM | str | Path | None = None,
    workers: Workers | None = None,
) -> dict[str, Any]:
    """Train a biLM; what `elmo-spacy pretrain` runs. Writes to `output_dir`
    (see `RunFolder`): `model-best/` and `model-last/` (biLM directories),
    `checkpoint-<step>/` every `checkpoint_every` steps and at each epoch's
    end, and `pretrain_log.json`.

    corpus, dev: a `Corpus`, or paths: prepared folders, or text files
        prepared into `output_dir/corpus` (`dev-corpus`) first, tokenised as
        `lang` (default "en") or `pretokenized` say (see `open_corpus`);
        under torchrun rank 0 prepares while the others wait.
    bilm_config: the biLM's sizes; None (or its own) with `init_bilm`.

    Dev perplexity is measured on a seeded sample of the corpus's docs held
    out of training (`dev_fraction`, `max_dev_tokens`; with dev_fraction = 0,
    a sample of the training docs, held in), or on a sample of `dev`. The
    vocabulary of a fresh biLM comes from the type counts of the docs it
    trains on (`max_vocab_size`, `min_count`).
    With `resume`, training goes on from the latest checkpoint in `output_dir`
    (weights, Adam state, step, random state, position in the epoch) and ends
    with the same weights as an uninterrupted run on the CPU; a checkpoint of
    another corpus is refused. An `output_dir` that holds an earlier run is
    refused unless `resume` goes on from it or `overwrite` replaces it (see
    `RunFolder.check`). A folder this call made is removed again if the run
    fails before training (a user error, a damaged corpus), prepared text and all.
    `init_vectors` (word -> vector of width word_dim, or the path of a spaCy
    pipeline or vectors folder) start the word encoder's embeddings of a
    fresh run (see `BiLM.init_word_vectors`).
    `init_bilm` (a pretrained biLM with its softmax head, or the path of one)
    is trained further on this corpus instead of a fresh one (a `BiLM` in
    place), its vocabulary and sizes kept: adapting it to the text of a task
    or domain, as bilm-tf's restart.py does. Its dev perplexity before the
    first step is logged as `init_dev_perplexity`.
    `workers` (from `start_workers`) places the biLM on a device and, under
    torchrun, trains data-parallel: each rank builds and trains on every
    world_size-th piece of each batch, and only rank 0 writes files. With
    dropout 0 this trains the same weights as one process (up to float
    rounding); with dropout, each rank draws its own masks.
    `config.precision` = "bfloat16" or "float16" trains and measures dev
    perplexity under autocast (float32 with a warning where it does not pay);
    the weights, checkpoints and saved biLMs stay float32.
    The process keeps the memory that training steps free for the next ones
    (`keep_freed_memory`).
    Returns the log: settings, the corpus, perplexities per evaluation and
    epoch, tokens/s, the time to the first step and the wall time.
    """
    started = time.perf_counter()
    keep_freed_memory()  # the steps reuse what the step before freed
    workers = workers or Workers()
    folder = RunFolder(output_dir)
    folder.check(resume=resume, overwrite=overwrite)  # before any work
    init_bilm = _bilm_to_train_further(init_bilm, bilm_config, init_vectors)
    bilm_config = init_bilm.config if init_bilm is not None else bilm_config
    new_folder = not folder.path.exists()
    given = ", ".join(map(str, corpus)) if not isinstance(corpus, Corpus) else None
    try:
        corpus, dev = _open_corpora(corpus, dev, folder, lang, pretokenized, workers)
        sample = _dev_sample(corpus, dev, config, given)
        start = _start(
            folder,
            corpus,
            dev,
            sample,
            bilm_config,
            config,
            resume,
            init_bilm,
            init_vectors,
            workers,
            show_progress,
        )
    except (ElmoSpacyError, OSError):
        if new_folder and workers.is_main and not folder.earlier_run():
            shutil.rmtree(folder.path, ignore_errors=True)  # and what it prepared
        raise
    bilm, state = start.bilm, start.state
    data = _training_data(corpus, sample, bilm, config, workers.world_size)
    if init_bilm is not None and start.checkpoint is None:
        state.init_dev_perplexity = evaluate_perplexity(
            bilm, (data.build_dev(p) for p in workers.share(data.dev_batches)), workers
        )
        if show_progress and workers.is_main:
            tqdm.write(f"dev perplexity before training: {state.init_dev_perplexity['mean']:.1f}")
    if workers.is_main:  # only now: a run refused above leaves no folder behind
        if overwrite:
            folder.remove_earlier_run()
        folder.path.mkdir(parents=True, exist_ok=True)
    run = Pretraining(
        bilm=bilm,
        optimizer=start.optimizer,
        loss=_loss(bilm, config, state, workers),
        data=data,
        config=config,
        folder=folder,
        workers=workers,
        show_progress=show_progress and workers.is_main,
        state=state,
        started=started,
        scaler=_scaler(bilm, state, workers),
        corpus_check=CorpusCheck(dict.fromkeys([corpus, sample.corpus]))
        if workers.is_main
        else None,
    )
    run.run()
    log = {
        "bilm": bilm.config.to_dict(),
        "training": config.to_dict(),
        "corpus": corpus.describe(),
        "dev": {
            "corpus": "held out of the corpus" if dev is None else dev.describe(),
            "docs": len(sample.docs),
            "tokens": data.dev_tokens,
            "held_out": sample.held_out or dev is not None,
        },
        "vocab_size": len(bilm.vocab),
        "words_from_init_vectors": start.words_from_vectors,
        "init_dev_perplexity": state.init_dev_perplexity,
        "world_size": workers.world_size,
        "batch_tokens_scope": "one optimizer step, all ranks together",
        "precision": bilm.precision,
        "epochs": state.epochs,
        "evaluations": state.evaluations,
        "best_dev_perplexity": state.best,
        "steps": state.step,
        "tokens": state.tokens,
        "seconds_to_first_step": run.first_step,
        "wall_seconds": time.perf_counter() - started,
        "resumed_from": None if start.checkpoint is None else str(start.checkpoint),
    }
    if workers.is_main:
        folder.log.write_text(json.dumps(log, indent=2) + "\n")
    workers.wait_for_all()  # no rank leaves the process group while another still writes
    return log


@dataclass
class Start:
    """Where a run starts: a fresh biLM, one trained further, or a checkpoint."""

    bilm: BiLM
    optimizer: torch.optim.Optimizer
    state: RunState
    checkpoint: Path | None = None  # resumed from
    words_from_vectors: int | None = None  # of init_vectors


def _open_corpora(
    corpus: Corpus | Sequence[str | Path],
    dev: Corpus | Sequence[str | Path] | None,
    folder: RunFolder,
    lang: str | None,
    pretokenized: bool,
    workers: Workers,
) -> tuple[Corpus, Corpus | None]:
    """The corpora, text prepared into the run folder; rank 0 prepares while
    the others wait, then they read what it wrote."""
    text = {"lang": lang, "pretokenized": pretokenized}
    if not workers.is_main:
        workers.wait_for_all()
    if not isinstance(corpus, Corpus):
        corpus = open_corpus(corpus, folder.corpus, **text)
    if dev is not None and not isinstance(dev, Corpus):
        dev = open_corpus(dev, folder.dev_corpus, **text)
    if workers.is_main:
        workers.wait_for_all()
    return corpus, dev


def _dev_sample(
    corpus: Corpus, dev: Corpus | None, config: PretrainConfig, given: str | None = None
) -> DevSample:
    """The docs of dev perplexity: held out of (or, with dev_fraction 0, held
    in) the corpus, or drawn from `dev`. A corpus too small says so, naming
    what was `given` (else the corpus's folders)."""
    try:
        if dev is not None:
            return dev_sample(dev, 1.0, config.max_dev_tokens, config.seed, held_out=False)
        held_out = config.dev_fraction > 0
        return dev_sample(
            corpus, config.dev_fraction, config.max_dev_tokens, config.seed, held_out=held_out
        )
    except NotEnoughText as err:
        given = given or ", ".join(str(f.path) for f in corpus.folders)
        raise NotEnoughText(f"{given}: {err}") from err


def _start(
    folder: RunFolder,
    corpus: Corpus,
    dev: Corpus | None,
    sample: DevSample,
    bilm_config: BiLMConfig,
    config: PretrainConfig,
    resume: bool,
    init_bilm: BiLM | None,
    init_vectors: Mapping[str, numpy.ndarray] | str | Path | None,
    workers: Workers,
    show_progress: bool,
) -> Start:
    """The biLM, its optimiser and the run's state: from the latest
    checkpoint (`resume`), from `init_bilm`, or fresh (a vocabulary of the
    docs trained on, word vectors from `init_vectors`), in the precision
    `config` asks for."""
    fingerprint = corpus.fingerprint + ("" if dev is None else f"+{dev.fingerprint}")
    checkpoint = folder.latest_checkpoint() if resume else None
    if checkpoint is not None:
        bilm, optimizer, state = load_checkpoint(checkpoint, bilm_config, config, workers.device)
        _check_same_corpus(checkpoint, state, fingerprint, corpus, dev)
        _warn_of_other_batching(checkpoint, state, config, say=workers.is_main)
        if show_progress and workers.is_main:
            tqdm.write(f"Resuming from {checkpoint} (step {state.step}, epoch {state.epoch})")
        if state.finished:  # it goes on where `config` now allows more
            reached = limits_reached(state, config)
            state.finished = bool(reached)
            if show_progress and workers.is_main:
                tqdm.write(
                    f"The run had finished ({'; '.join(reached)}): nothing to train. To train "
                    "further, raise that limit (--training.<name>)."
                    if reached
                    else "The run had finished; [training] now allows more, so it goes on."
                )
        start = Start(bilm, optimizer, state, checkpoint)
    else:
        torch.manual_seed(config.seed)
        if init_bilm is not None:
            bilm = init_bilm
            if bilm.tokenization is not None and bilm.tokenization != corpus.tokenization:
                warnings.warn(
                    f"The biLM trained further learned {bilm.tokenization}; this corpus was "
                    f"cut by {corpus.tokenization}, which it records from now on.",
                    stacklevel=3,
                )
        else:
            vocab = corpus_vocabulary(
                corpus.types, bilm_config.max_vocab_size, bilm_config.min_count, held_out=sample
            )
            bilm = BiLM(bilm_config, vocab)
        bilm.tokenization = corpus.tokenization
        words = None
        if init_vectors is not None:
            words = bilm.init_word_vectors(_vectors(init_vectors))
        bilm.to(workers.device)
        state = RunState(corpus=fingerprint, batching=batching_settings(config))
        start = Start(bilm, new_optimizer(bilm, config), state, words_from_vectors=words)
    with warnings.catch_warnings():
        if not workers.is_main:  # rank 0 says it for all: one fall-back warning, not one a rank
            warnings.simplefilter("ignore", RuntimeWarning)
        start.bilm.set_precision(config.precision, "[training] precision")
    return start


def _training_data(
    corpus: Corpus, sample: DevSample, bilm: BiLM, config: PretrainConfig, world_size: int
) -> TrainingData:
    dev_pieces = sample.pieces(config.max_length)
    return TrainingData(
        corpus=corpus,
        dev=sample,
        dev_batches=ordered_batches(dev_pieces, config.eval_batch_tokens),
        build=BatchBuilder(corpus, bilm, shape_buckets(config, world_size)),
        build_dev=BatchBuilder(sample.corpus, bilm),
        epoch_tokens=corpus.n_tokens - (dev_pieces.tokens if sample.held_out else 0),
        dev_tokens=dev_pieces.tokens,
    )


def shape_buckets(config: PretrainConfig, world_size: int = 1) -> ShapeBuckets | None:
    """The buckets that each rank's share of a training batch is padded to
    (`[training] shape_buckets`), or None."""
    if not config.shape_buckets:
        return None
    return ShapeBuckets(config.shape_buckets, config.batch_tokens, world_size)


def _loss(bilm: BiLM, config: PretrainConfig, state: RunState, workers: Workers) -> nn.Module:
    """The loss of a rank's share (`ShareLoss`), data-parallel under torchrun."""
    loss: nn.Module = ShareLoss(bilm, workers.world_size)
    if workers.distributed:
        torch.manual_seed(config.seed + 7919 * state.step + workers.rank)  # own dropout masks
        # Tail clusters of the adaptive softmax go unused on batches without their words.
        loss = DistributedDataParallel(loss, find_unused_parameters=True)
    return loss


def _scaler(bilm: BiLM, state: RunState, workers: Workers) -> torch.amp.GradScaler | None:
    """torch's loss scaler where the biLM trains in float16 (its state as the
    checkpoint left it)."""
    if bilm.precision != "float16":
        return None
    scaler = torch.amp.GradScaler(workers.device.type)
    if state.loss_scale is not None:
        scaler.load_state_dict(state.loss_scale)
    return scaler


def _bilm_to_train_further(
    init_bilm: BiLM | str | Path | None,
    bilm_config: BiLMConfig | None,
    init_vectors: Mapping[str, numpy.ndarray] | str | Path | None,
) -> BiLM | None:
    """`init_bilm`, loaded with its softmax head where it is a path, checked:
    it has its softmax, keeps its own sizes, and starts from its own word
    embeddings (not `init_vectors`)."""
    if init_bilm is None:
        if bilm_config is None:
            raise ElmoSpacyError("A fresh biLM needs its [bilm] config: bilm_config is None")
        return None
    if init_vectors is not None:
        raise ElmoSpacyError(
            "Word vectors start a fresh biLM's embeddings; a biLM trained further keeps "
            "its own: give init_vectors (--init-vectors) or init_bilm (--init-bilm), not both."
        )
    if not isinstance(init_bilm, BiLM):
        init_bilm = load_bilm(init_bilm, with_softmax=True)
    if init_bilm.softmax is None:
        raise ElmoSpacyError(
            "The biLM to train further has no softmax head (converted models and biLMs "
            "loaded with with_softmax=False have none): load a biLM that `elmo-spacy "
            "pretrain` wrote, with its softmax."
        )
    if bilm_config is not None and init_bilm.config != bilm_config:
        raise ElmoSpacyError(
            "The biLM to train further has another [bilm] config than the one given: "
            "it keeps its own (pass its config, bilm.config, or None)."
        )
    return init_bilm


def _vectors(vectors: Mapping[str, numpy.ndarray] | str | Path) -> Mapping[str, numpy.ndarray]:
    """Word vectors: as given, or those of a spaCy pipeline or vectors folder."""
    if isinstance(vectors, Mapping):
        return vectors
    import spacy

    table = spacy.load(vectors).vocab.vectors
    return {table.strings[key]: table.data[row] for key, row in table.key2row.items()}


def _check_same_corpus(
    checkpoint: Path, state: RunState, fingerprint: str, corpus: Corpus, dev: Corpus | None
) -> None:
    if state.corpus == fingerprint:
        return
    given = ", ".join(str(f.path) for f in corpus.folders)
    if dev is not None:
        given += f" (dev: {', '.join(str(f.path) for f in dev.folders)})"
    raise ElmoSpacyError(
        f"{checkpoint} was trained on another corpus than the one given ({given}; "
        f"fingerprint {fingerprint[:12]}, the checkpoint's {state.corpus[:12]}): a resumed "
        "run goes on over the same docs in the same order. Resume with the corpus it was "
        "started on, or start a new run (--overwrite, or another output folder)."
    )


DEV_SETTINGS = ("seed", "dev_fraction", "max_dev_tokens")  # those that draw the dev sample
BATCHING_SETTINGS = (*DEV_SETTINGS, "max_length", "batch_tokens", "shape_buckets")


def batching_settings(config: PretrainConfig) -> dict[str, Any]:
    """The [training] settings that decide the dev sample and each epoch's
    batches, which a resumed run must share to go on where it stopped."""
    return {name: getattr(config, name) for name in BATCHING_SETTINGS}


def _warn_of_other_batching(
    checkpoint: Path, state: RunState, config: PretrainConfig, say: bool = True
) -> None:
    """Warn where a resumed run batches its epochs otherwise than the run it
    resumes, in the middle of an epoch or with another dev sample
    (checkpoints of earlier versions record none; `say`: rank 0 says it
    for all), and record the new settings."""
    batching = batching_settings(config)
    changed = {k: (v, batching[k]) for k, v in state.batching.items() if batching.get(k) != v}
    state.batching = batching
    dev = changed.keys() & set(DEV_SETTINGS)
    if not say or not (dev or changed and state.batch):  # new settings from an epoch's start: fine
        return
    consequences = []
    if state.batch:
        consequences.append(
            f"the rest of epoch {state.epoch} follows the new settings from its batch "
            f"{state.batch}, so some of its docs are trained on twice or not at all"
        )
    if dev:
        consequences.append("the dev sample is drawn anew, perhaps from docs trained on")
    what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
    warnings.warn(
        f"{checkpoint} was trained with other [training] settings that batch the epochs "
        f"({what}): {'; '.join(consequences)}. Resume with the same settings to go on "
        "exactly where the run stopped.",
        stacklevel=4,
    )


def perplexity(nll: float, n_tokens: int) -> float:
    """exp(mean NLL per token), capped so that an early, huge loss does not overflow."""
    return math.exp(min(nll / max(n_tokens, 1), 50))


@torch.inference_mode()
def evaluate_perplexity(
    bilm: BiLM, batches: Iterable[TokenBatch], workers: Workers | None = None
) -> dict[str, float]:
    """Exact perplexity of the batches per direction and their geometric mean.
    Every word and the closing (forwards) or opening (backwards) boundary counts.
    With `workers`, each rank gives its own share of the batches and the sums
    are taken over all ranks."""
    workers = workers or Workers()
    was_training = bilm.training
    bilm.eval()
    device = next(bilm.parameters()).device
    forward = torch.zeros((), dtype=torch.float64, device=device)
    backward = torch.zeros((), dtype=torch.float64, device=device)
    n_tokens = 0
    for batch in batches:
        if device.type == "cpu":  # what training or the last batch freed: each shape is another
            release_freed_memory()
        loss = bilm.lm_loss(batch)
        forward += loss.forward_nll
        backward += loss.backward_nll
        n_tokens += loss.n_tokens
    bilm.train(was_training)
    forward, backward, n_tokens = workers.sum([forward, backward, n_tokens])
    return {
        "forward": perplexity(forward, n_tokens),
        "backward": perplexity(backward, n_tokens),
        "mean": perplexity(forward + backward, 2 * n_tokens),
    }
