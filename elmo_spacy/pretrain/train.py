"""Pretraining's setup: `pretrain` opens the corpus, draws the dev sample,
builds the biLM and its optimizer or resumes them from the latest checkpoint
(`RunFolder`), and hands them to the loop (`loop.Pretraining`)."""

import json
import shutil
import socket
import tempfile
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

from ..bilm import BiLM, BiLMConfig, load_bilm
from ..bilm.model.softmax import fitted_cutoffs, oversized_clusters
from ..errors import ElmoSpacyError
from .batches import (
    BatchBuilder,
    DevSample,
    NotEnoughText,
    corpus_vocabulary,
    dev_sample,
    ordered_batches,
)
from .checkpoint import RunState, load_checkpoint, new_optimizer
from .config import PretrainConfig
from .corpus import Corpus, CorpusCheck
from .distributed import Workers, folder_groups, send_folder
from .limits import limits_reached
from .loop import (
    Pretraining,
    ShareLoss,
    TrainingData,
    evaluate_perplexity,
    training_step,
)
from .memory import keep_freed_memory
from .prepare import open_corpus
from .run_folder import RunFolder

__all__ = ["NotEnoughText", "ShareLoss", "evaluate_perplexity", "pretrain", "training_step"]


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
    another corpus is refused, and so is `resume` where `output_dir` (rank
    0's) holds no checkpoint: nothing to resume. An `output_dir` that holds
    an earlier run is refused unless `resume` goes on from it or `overwrite`
    replaces it (see `RunFolder.check`). A folder this call made is removed again if the run
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
    folder = RunFolder(output_dir)
    folder.check(resume=resume, overwrite=overwrite)  # before any work
    workers = folder_groups(workers or Workers(), folder.path)
    if resume:  # rank 0's folder decides, so that every rank refuses alike
        nothing = workers.from_main(folder.nothing_to_resume() if workers.is_main else None)
        if nothing is not None:
            raise ElmoSpacyError(nothing)
    if show_progress and workers.is_main and not workers.folders_shared:
        groups = _ranks_by_folder(workers)
        tqdm.write(
            f"The {workers.world_size} ranks see {len(groups)} different output folders (no "
            f"shared filesystem; ranks by folder: {groups}): the first rank of each prepares "
            f"text, and {folder.path} on rank 0's machine holds the checkpoints, models and log."
        )
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
    data = _training_data(corpus, sample, bilm, config)
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
        "softmax": {"cutoffs": bilm.softmax.cluster_starts, "div_value": bilm.softmax.div_value},
        "words_from_init_vectors": start.words_from_vectors,
        "init_dev_perplexity": state.init_dev_perplexity,
        "world_size": workers.world_size,
        "ranks_by_folder": _ranks_by_folder(workers),
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
    """The corpora, text prepared into the run folder: the first rank of the
    ranks that see one folder prepares while the others wait, then they read
    what it wrote (on machines without a shared filesystem, one rank per
    machine prepares). Every rank must then hold the same corpus."""
    text = {"lang": lang, "pretokenized": pretokenized}
    if not workers.prepares:
        workers.wait_for_all()
    if not isinstance(corpus, Corpus):
        corpus = open_corpus(corpus, folder.corpus, **text)
    if dev is not None and not isinstance(dev, Corpus):
        dev = open_corpus(dev, folder.dev_corpus, **text)
    if workers.prepares:
        workers.wait_for_all()
    _check_same_corpora(workers, corpus, dev)
    return corpus, dev


def _check_same_corpora(workers: Workers, corpus: Corpus, dev: Corpus | None) -> None:
    """Refuse a run whose ranks read different corpora: machines that see
    different files under the same paths."""
    mine = (corpus.fingerprint, None if dev is None else dev.fingerprint, socket.gethostname())
    seen = workers.gather(mine)
    others = [rank for rank, theirs in enumerate(seen) if theirs[:2] != seen[0][:2]]
    if others:
        rank = others[0]
        raise ElmoSpacyError(
            f"Rank {rank} (on {seen[rank][2]}) reads another corpus than rank 0 (on "
            f"{seen[0][2]}) under the same paths ({', '.join(str(f.path) for f in corpus.folders)}): "
            "every machine must see the same text or prepared folders. Copy them to each "
            "machine, or put them on a filesystem all machines share."
        )


def _ranks_by_folder(workers: Workers) -> list[list[int]]:
    """The ranks in groups that see one output folder: [[0, 1, ...]] where
    all share a filesystem, a group a machine where none is shared."""
    leaders = workers.folder_leaders or (0,) * workers.world_size
    groups: dict[int, list[int]] = {}
    for rank, leader in enumerate(leaders):
        groups.setdefault(leader, []).append(rank)
    return list(groups.values())


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
    checkpoint = None
    if resume:  # ranks that cannot see rank 0's folder are sent its latest checkpoint
        latest = folder.latest_checkpoint() if workers.sees_main_folder else None
        with tempfile.TemporaryDirectory(prefix="elmo-spacy-checkpoint-") as received:
            checkpoint = send_folder(workers, latest, Path(received))
            if checkpoint is not None:
                loaded = load_checkpoint(checkpoint, bilm_config, config, workers.device)
                checkpoint = folder.path / checkpoint.name  # as rank 0 names it
    if checkpoint is not None:
        bilm, optimizer, state = loaded
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
            if workers.is_main:
                _warn_of_oversized_clusters(bilm_config, bilm)
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
    corpus: Corpus, sample: DevSample, bilm: BiLM, config: PretrainConfig
) -> TrainingData:
    dev_pieces = sample.pieces(config.max_length)
    return TrainingData(
        corpus=corpus,
        dev=sample,
        dev_batches=ordered_batches(dev_pieces, config.eval_batch_tokens),
        build=BatchBuilder(corpus, bilm),
        build_dev=BatchBuilder(sample.corpus, bilm),
        epoch_tokens=corpus.n_tokens - (dev_pieces.tokens if sample.held_out else 0),
        dev_tokens=dev_pieces.tokens,
    )


def _warn_of_oversized_clusters(bilm_config: BiLMConfig, bilm: BiLM) -> None:
    """Say where the [bilm] cutoffs given leave a tail cluster of more than
    MAX_CLUSTER_WORDS words (each of its words' predictions normalised over
    all of them), and what "auto" would give."""
    if bilm_config.cutoffs == "auto" or bilm.softmax is None or not bilm.softmax.adaptive:
        return
    oversized = oversized_clusters(bilm_config.cutoffs, len(bilm.vocab))
    if oversized:
        first, end = oversized[-1]
        fitted, div_value = fitted_cutoffs(
            len(bilm.vocab), bilm_config.projection_dim, bilm_config.div_value
        )
        warnings.warn(
            f"[bilm] cutoffs = {bilm_config.cutoffs} leave a tail cluster of {end - first:,} "
            f"words (ids {first:,} to {end:,}) in this {len(bilm.vocab):,}-word vocabulary: "
            "every prediction of one of its words is normalised over all of them, which can "
            f'cost the step many times over. cutoffs = "auto" gives {fitted} (div_value '
            f"{div_value:g}); or cap the vocabulary (max_vocab_size, min_count).",
            stacklevel=4,
        )


def _loss(bilm: BiLM, config: PretrainConfig, state: RunState, workers: Workers) -> nn.Module:
    """The loss of a rank's share (`ShareLoss`), data-parallel under torchrun."""
    loss: nn.Module = ShareLoss(bilm, workers.world_size)
    if workers.distributed:
        torch.manual_seed(config.seed + 7919 * state.step + workers.rank)  # own dropout masks
        # ShareLoss reaches every parameter at every step: no search for unused ones.
        loss = DistributedDataParallel(loss, find_unused_parameters=False)
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
BATCHING_SETTINGS = (*DEV_SETTINGS, "max_length", "batch_tokens")


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
    for all), and record the new settings. A recorded setting that is no
    longer one is not compared."""
    batching = batching_settings(config)
    changed = {
        k: (v, batching[k]) for k, v in state.batching.items() if k in batching and batching[k] != v
    }
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
