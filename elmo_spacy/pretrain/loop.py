"""The pretraining loop, `Pretraining.run`: steps, dev perplexity,
checkpoints, and where to stop (`limits.limits_reached`)."""

import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..bilm import BiLM, TokenBatch, save_bilm
from .batches import BatchBuilder, DevSample, Prefetcher, Spans, epoch_batches
from .checkpoint import RunState, save_checkpoint
from .config import PretrainConfig
from .corpus import Corpus, CorpusCheck
from .distributed import ProcessGroup
from .limits import limits_reached
from .memory import release_freed_memory
from .run_folder import RunFolder


@dataclass
class TrainingData:
    """What a run trains on and measures, and a `BatchBuilder` for each."""

    corpus: Corpus
    dev: DevSample
    dev_batches: list[Spans]
    build: BatchBuilder
    build_dev: BatchBuilder
    epoch_tokens: int  # of text trained on in an epoch
    dev_tokens: int  # of the dev sample

    def dev_perplexity(self, bilm: BiLM, group: ProcessGroup) -> dict[str, float]:
        batches = (self.build_dev(s) for s in group.share(self.dev_batches))
        return evaluate_perplexity(bilm, batches, group)


@dataclass(kw_only=True)
class Pretraining:
    """One process (rank) of a pretraining run; `state` is what checkpoints save."""

    bilm: BiLM
    optimizer: torch.optim.Optimizer
    data: TrainingData
    config: PretrainConfig
    folder: RunFolder
    group: ProcessGroup
    show_progress: bool
    state: RunState
    started: float  # time.perf_counter() when pretrain() began
    first_step: float | None = None  # seconds from `started` to the first step
    _clock: float = field(default_factory=time.perf_counter)  # training time counted up to
    _checkpointed: float = field(default_factory=time.perf_counter)  # the last checkpoint's time

    def __post_init__(self) -> None:
        self.loss: nn.Module = RankLoss(self.bilm, self.group.world_size)
        if self.group.distributed:  # each rank draws its own dropout masks
            torch.manual_seed(self.config.seed + 7919 * self.state.step + self.group.rank)
            self.loss = DistributedDataParallel(self.loss, find_unused_parameters=False)
        self.scaler = None  # training in float16: torch's loss scaler
        if self.bilm.precision == "float16":
            self.scaler = torch.amp.GradScaler(self.group.device.type)
            if self.state.loss_scale is not None:
                self.scaler.load_state_dict(self.state.loss_scale)
        # rank 0 checks the corpus's files while training reads them
        corpora = dict.fromkeys([self.data.corpus, self.data.dev.corpus])
        self.corpus_check = CorpusCheck(corpora if self.group.is_main else [])
        self._nll = torch.zeros((), device=self.group.device)  # summed since the last sync

    def run(self) -> None:
        """Train epoch after epoch until a limit of [training] is reached."""
        state, config = self.state, self.config
        while not state.finished:
            self.bilm.train()
            self._clock = time.perf_counter()
            stop = False
            with self.rest_of_epoch() as batches, self.progress_bar() as bar:
                for batch, spans, weight in batches:
                    self.step(batch, spans, weight)
                    bar.update(spans.tokens)
                    # The hours and the minutes since the last checkpoint differ between
                    # ranks: they are agreed on where the ranks sync, at one step for all.
                    stop = bool(limits_reached(state, config, at="step"))
                    checkpoint = (
                        config.checkpoint_every and state.step % config.checkpoint_every == 0
                    )
                    if state.step % config.log_every == 0 or stop:
                        out_of_time, checkpoint_due = self.sync(
                            limits_reached(state, config, at="log"), self.checkpoint_overdue()
                        )
                        stop, checkpoint = stop or out_of_time, checkpoint or checkpoint_due
                        bar.set_postfix(
                            ppl=f"{perplexity(state.epoch_nll, state.epoch_tokens):.1f}",
                            tok_s=f"{state.epoch_tokens / max(state.epoch_seconds, 1e-9):.0f}",
                            refresh=False,
                        )
                    if stop:
                        break
                    if config.eval_every and state.step % config.eval_every == 0:
                        self.evaluate()
                        stop = bool(limits_reached(state, config, at="evaluation"))
                        if stop:
                            break
                    if checkpoint:
                        self.save_checkpoint()
            # The epoch's end, or where a limit stopped it.
            stop = self.sync(limits_reached(state, config, at="log"))[0] or stop
            if not state.evaluations or state.evaluations[-1]["step"] != state.step:
                self.evaluate()
            stop = stop or bool(limits_reached(state, config, at="evaluation"))
            self.log_epoch()
            state.next_epoch()
            state.finished = stop or bool(limits_reached(state, config, at="epoch"))
            self.save_checkpoint()

    def rest_of_epoch(self) -> Prefetcher:
        """This rank's share of the epoch's batches from batch `state.batch` on."""
        planned = epoch_batches(
            self.data.corpus,
            seed=self.config.seed,
            epoch=self.state.epoch,
            max_length=self.config.max_length,
            batch_tokens=self.config.batch_tokens,
            exclude=self.data.dev.excluded_from(self.data.corpus),
        )
        batches = itertools.islice(planned, self.state.batch, None)
        return Prefetcher(batches, self.data.build, self.group)

    def step(self, batch: TokenBatch, spans: Spans, weight: float) -> None:
        """One training step on this rank's share of the batch `spans`, counted."""
        if self.first_step is None:
            self.first_step = time.perf_counter() - self.started
        self.corpus_check.raise_if_failed()
        self._nll += training_step(
            self.loss,
            self.optimizer,
            self.config.grad_clip,
            batch,
            spans.predictions,
            weight,
            scaler=self.scaler,
        )
        state, now = self.state, time.perf_counter()
        state.step += 1
        state.batch += 1
        state.epoch_tokens += spans.predictions
        state.epoch_text_tokens += spans.tokens
        state.tokens += spans.tokens
        state.epoch_seconds += now - self._clock
        state.train_seconds += now - self._clock
        self._clock = now

    def sync(self, *flags) -> list[bool]:
        """Add the NLL summed on the device since the last sync, over all ranks,
        to the epoch's; returns `flags`, each true where it is on any rank."""
        nll, *anywhere = self.group.sum([self._nll, *(float(bool(f)) for f in flags)])
        self.state.epoch_nll += nll
        self._nll.zero_()
        return [f > 0 for f in anywhere]

    def checkpoint_overdue(self) -> bool:
        """Whether `checkpoint_minutes` have passed since the last checkpoint."""
        minutes = self.config.checkpoint_minutes
        return bool(minutes) and time.perf_counter() - self._checkpointed >= 60 * minutes

    def evaluate(self) -> None:
        """Measure dev perplexity, write model-last/ and, the best yet, model-best/."""
        bilm, state = self.bilm, self.state
        self.sync()
        dev = self.data.dev_perplexity(bilm, self.group)
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
        self.corpus_check.wait()  # nothing trained on a damaged file is written
        if self.group.is_main:
            save_bilm(bilm, self.folder.model_last)
        if dev["mean"] < state.best:
            state.best, state.bad_evaluations = dev["mean"], 0
            if self.group.is_main:
                save_bilm(bilm, self.folder.model_best)
        else:
            state.bad_evaluations += 1
        if self.show_progress:
            tqdm.write(
                f"step {state.step} (epoch {state.epoch}): dev perplexity forward "
                f"{dev['forward']:.1f}, backward {dev['backward']:.1f}, mean {dev['mean']:.1f}"
            )
        self._clock = time.perf_counter()

    def log_epoch(self) -> None:
        state = self.state
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

    def save_checkpoint(self) -> None:
        """Rank 0 writes the checkpoint; the others wait until it is in place."""
        self.sync()
        if self.scaler is not None:
            self.state.loss_scale = self.scaler.state_dict()
        self.corpus_check.wait()
        if self.group.is_main:
            save_checkpoint(self.folder, self.bilm, self.optimizer, self.state)
        self.group.wait_for_all()
        self._clock = self._checkpointed = time.perf_counter()

    def progress_bar(self) -> tqdm:
        state = self.state
        return tqdm(
            total=self.data.epoch_tokens,
            initial=state.epoch_text_tokens,
            desc=f"epoch {state.epoch}",
            disable=not self.show_progress,
            unit="tok",
            unit_scale=True,
            mininterval=1.0,
        )


def training_step(
    loss: nn.Module,
    optimizer: torch.optim.Optimizer,
    grad_clip: float,
    batch: TokenBatch,
    batch_tokens: int,
    weight: float = 1.0,
    scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """One optimizer step on one rank's share of a batch through `loss` (a
    `RankLoss`, or its DistributedDataParallel), gradients clipped to
    `grad_clip`; returns the share's summed NLL, a tensor on the device."""
    scaled, nll = loss(batch, batch_tokens, weight)
    optimizer.zero_grad()
    parameters = optimizer.param_groups[0]["params"]
    if scaler is None:
        scaled.backward()
        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        optimizer.step()
    else:
        scaler.scale(scaled).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        scaler.step(optimizer)
        scaler.update()
    return nll


class RankLoss(nn.Module):
    """The LM loss of this rank's share of a batch, scaled so that the
    gradients, averaged over the ranks, are those of the whole batch's mean
    NLL per token (`batch_tokens`: its predictions); `weight` 0 adds nothing.
    A module, as DistributedDataParallel syncs gradients only through a
    module's forward; data-parallel, every parameter gets a gradient."""

    def __init__(self, bilm: BiLM, world_size: int) -> None:
        super().__init__()
        self.bilm = bilm
        self.world_size = world_size
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
    bilm: BiLM, batches: Iterable[TokenBatch], group: ProcessGroup | None = None
) -> dict[str, float]:
    """Exact perplexity of the batches per direction (every word and the
    closing or opening boundary) and their geometric mean; with `group`, of
    the shares of all ranks."""
    group = group or ProcessGroup()
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
    forward, backward, n_tokens = group.sum([forward, backward, n_tokens])
    return {
        "forward": perplexity(forward, n_tokens),
        "backward": perplexity(backward, n_tokens),
        "mean": perplexity(forward + backward, 2 * n_tokens),
    }
