"""The biLM training loop, top to bottom: each step trains on a planned batch
(Adam, gradient clipping), the figures come to the host every `log_every`
steps, dev perplexity is measured at each epoch's end (and every
`eval_every` steps), checkpoints are written for a killed run to resume from
(every `checkpoint_every` steps, every `checkpoint_minutes` and at each
epoch's end), and the run stops where `limits.limits_reached` says. What the loop runs
with (the corpus, the biLM, its optimizer, the state of a resumed run) is
set up by `train.pretrain`."""

import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm import tqdm

from ..bilm import BiLM, TokenBatch, save_bilm
from .batches import (
    BatchBuilder,
    DevSample,
    Pieces,
    Prefetcher,
    epoch_batches,
)
from .checkpoint import RunState, save_checkpoint
from .config import PretrainConfig
from .corpus import Corpus, CorpusCheck
from .distributed import Workers
from .limits import limits_reached
from .memory import release_freed_memory
from .run_folder import RunFolder


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
    _checkpointed: float = field(default_factory=time.perf_counter)  # the last checkpoint's time
    _checkpoint_due: bool = False  # checkpoint_minutes passed on some rank (`flush`)

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
                if self._checkpoint_due or (
                    config.checkpoint_every and state.step % config.checkpoint_every == 0
                ):
                    self.save_checkpoint()
        bar.close()
        self.end_epoch(stopped)

    def flush(self) -> bool:
        """Bring the figures kept on the device to the host (one wait, one
        collective): the NLL summed since the last flush, over all ranks, and
        the training time. Returns whether a limit checked here (the hours)
        is reached on any rank, so that all stop at the same step; and notes
        whether `checkpoint_minutes` have passed on any rank since the last
        checkpoint, so that all write it at the same step."""
        now = time.perf_counter()
        self.state.epoch_seconds += now - self._clock
        self.state.train_seconds += now - self._clock
        over = bool(limits_reached(self.state, self.config, at="flush"))
        minutes = self.config.checkpoint_minutes
        due = bool(minutes) and now - self._checkpointed >= 60 * minutes
        nll, over_anywhere, due_anywhere = self.workers.sum(
            [self._pending_nll, float(over), float(due)]
        )
        self._checkpoint_due = due_anywhere > 0
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
        self._clock = self._checkpointed = time.perf_counter()
        self._checkpoint_due = False


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
    module's forward.
    """

    def __init__(self, bilm: BiLM, world_size: int) -> None:
        super().__init__()
        self.bilm = bilm
        self.world_size = world_size
        # Data-parallel: every parameter's gradient at every step, so that
        # DistributedDataParallel need not search for unused ones.
        self.every_parameter = world_size > 1

    def forward(
        self, batch: TokenBatch, batch_tokens: int, weight: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.bilm.parameters()).device
        batch = batch.to(device, non_blocking=device.type == "cuda")  # from pinned memory
        loss = self.bilm.lm_loss(batch, every_parameter=self.every_parameter)
        nll = loss.forward_nll + loss.backward_nll
        # One float32 product each, by the factor rounded to float32 once.
        return nll * (weight * self.world_size / (2 * batch_tokens)), nll.detach() * (weight / 2)


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
