"""`pretrain`, what `elmo-spacy pretrain` runs: open the corpus, build the biLM
or resume it from its latest checkpoint, run the loop (`loop.Pretraining`),
write the run's log. The helpers below follow in that order."""

import contextlib
import json
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy
import torch
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
from .corpus import Corpus
from .distributed import ProcessGroup, find_folder_leaders, send_folder
from .limits import limits_reached
from .loop import Pretraining, TrainingData
from .memory import keep_freed_memory
from .prepare import open_corpus
from .run_folder import RunFolder

__all__ = ["NotEnoughText", "pretrain"]

Vectors = Mapping[str, numpy.ndarray] | str | Path


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
    init_vectors: Vectors | None = None,
    init_bilm: BiLM | str | Path | None = None,
    group: ProcessGroup | None = None,
) -> dict[str, Any]:
    """Train a biLM on `corpus` into `output_dir` and return the run's log;
    the options are those of `elmo-spacy pretrain` (docs/pretraining.md)."""
    started = time.perf_counter()
    keep_freed_memory()  # each step reuses what the step before freed
    folder = RunFolder(output_dir)
    folder.check(resume=resume, overwrite=overwrite)  # before any work
    group = find_folder_leaders(group or ProcessGroup(), folder.path)
    if resume:  # rank 0's folder decides, for every rank alike
        refused = group.from_main(folder.nothing_to_resume() if group.is_main else None)
        if refused is not None:
            raise ElmoSpacyError(refused)
    init_bilm, bilm_config = _bilm_to_train_further(init_bilm, bilm_config, init_vectors)
    with _removed_on_error(folder, group):
        # 1. The corpus, and the docs that dev perplexity is measured on
        named = None if isinstance(corpus, Corpus) else ", ".join(map(str, corpus))
        corpus, dev = _open_corpora(corpus, dev, folder, lang, pretokenized, group, show_progress)
        sample = _dev_sample(corpus, dev, config, named)
        # 2. The biLM, its optimizer and the run's state: resumed, or new
        if resume:
            start = _resume(folder, corpus, dev, bilm_config, config, group, show_progress)
        else:
            start = _new(corpus, dev, sample, bilm_config, config, init_bilm, init_vectors, group)
        with warnings.catch_warnings():
            if not group.is_main:  # rank 0 warns for all
                warnings.simplefilter("ignore", RuntimeWarning)
            start.bilm.set_precision(config.precision, "[training] precision")
        data = _training_data(corpus, sample, start.bilm, config)
        if init_bilm is not None and not resume:  # the dev perplexity before training
            before = start.state.init_dev_perplexity = data.dev_perplexity(start.bilm, group)
            if show_progress and group.is_main:
                tqdm.write(f"dev perplexity before training: {before['mean']:.1f}")
    if group.is_main:  # only now: a run refused above leaves no folder behind
        folder.make(overwrite=overwrite)
    # 3. The loop
    show_progress = show_progress and group.is_main
    run = Pretraining(
        bilm=start.bilm,
        optimizer=start.optimizer,
        state=start.state,
        data=data,
        config=config,
        folder=folder,
        group=group,
        show_progress=show_progress,
        started=started,
    )
    run.run()
    # 4. The run's log
    log = _log(run, dev, start)
    if group.is_main:
        folder.log.write_text(json.dumps(log, indent=2) + "\n")
    group.wait_for_all()  # no rank leaves the process group while another still writes
    return log


@dataclass
class Start:
    """Where a run starts: a fresh biLM, one trained further, or a checkpoint."""

    bilm: BiLM
    optimizer: torch.optim.Optimizer
    state: RunState
    checkpoint: Path | None = None  # resumed from
    words_from_vectors: int | None = None  # of init_vectors


@contextlib.contextmanager
def _removed_on_error(folder: RunFolder, group: ProcessGroup) -> Iterator[None]:
    """Remove the run's folder, text prepared there and all, where this call
    made it and a user error stops the run before training."""
    made = not folder.path.exists()
    try:
        yield
    except (ElmoSpacyError, OSError):
        if made and group.is_main and not folder.earlier_run():
            shutil.rmtree(folder.path, ignore_errors=True)
        raise


def _open_corpora(
    corpus: Corpus | Sequence[str | Path],
    dev: Corpus | Sequence[str | Path] | None,
    folder: RunFolder,
    lang: str | None,
    pretokenized: bool,
    group: ProcessGroup,
    show_progress: bool,
) -> tuple[Corpus, Corpus | None]:
    """The corpora, text prepared by the first rank of each folder while the
    others wait; every rank must then hold the same."""
    if show_progress and group.is_main and not group.folders_shared:
        tqdm.write(
            f"The {group.world_size} ranks see {len(group.ranks_by_folder)} different output "
            f"folders (no shared filesystem; ranks by folder: {group.ranks_by_folder}): the "
            f"first rank of each prepares text, and {folder.path} on rank 0's machine holds the "
            "checkpoints, models and log."
        )
    text = {"lang": lang, "pretokenized": pretokenized}
    if not group.prepares:
        group.wait_for_all()
    if not isinstance(corpus, Corpus):
        corpus = open_corpus(corpus, folder.corpus, **text)
    if dev is not None and not isinstance(dev, Corpus):
        dev = open_corpus(dev, folder.dev_corpus, **text)
    if group.prepares:
        group.wait_for_all()
    mine = (corpus.fingerprint, None if dev is None else dev.fingerprint, socket.gethostname())
    seen = group.gather(mine)
    others = [rank for rank, theirs in enumerate(seen) if theirs[:2] != seen[0][:2]]
    if others:
        raise ElmoSpacyError(
            f"Rank {others[0]} (on {seen[others[0]][2]}) reads another corpus than rank 0 (on "
            f"{seen[0][2]}) under the same paths ({corpus.paths}): every machine must see the "
            "same text or prepared folders. Copy them to each machine, or put them on a "
            "filesystem all machines share."
        )
    return corpus, dev


def _dev_sample(
    corpus: Corpus, dev: Corpus | None, config: PretrainConfig, named: str | None = None
) -> DevSample:
    """The docs of dev perplexity, of the corpus or of `dev`."""
    source, fraction = (corpus, config.dev_fraction) if dev is None else (dev, 1.0)
    held_out = dev is None and fraction > 0
    try:
        return dev_sample(source, fraction, config.max_dev_tokens, config.seed, held_out)
    except NotEnoughText as err:
        raise NotEnoughText(f"{named or corpus.paths}: {err}") from err


def _fingerprint(corpus: Corpus, dev: Corpus | None) -> str:
    return corpus.fingerprint + ("" if dev is None else f"+{dev.fingerprint}")


def _resume(
    folder: RunFolder,
    corpus: Corpus,
    dev: Corpus | None,
    bilm_config: BiLMConfig,
    config: PretrainConfig,
    group: ProcessGroup,
    show_progress: bool,
) -> Start:
    """The run at the latest checkpoint in rank 0's folder, which must have
    trained on the same corpus."""
    latest = folder.latest_checkpoint() if group.sees_main_folder else None
    with tempfile.TemporaryDirectory(prefix="elmo-spacy-checkpoint-") as received:
        checkpoint = send_folder(group, latest, Path(received))
        bilm, optimizer, state = load_checkpoint(checkpoint, bilm_config, config, group.device)
    checkpoint = folder.path / checkpoint.name  # as rank 0 names it
    fingerprint = _fingerprint(corpus, dev)
    if state.corpus != fingerprint:
        given = corpus.paths + ("" if dev is None else f" (dev: {dev.paths})")
        raise ElmoSpacyError(
            f"{checkpoint} was trained on another corpus than the one given ({given}; "
            f"fingerprint {fingerprint[:12]}, the checkpoint's {state.corpus[:12]}): a resumed "
            "run goes on over the same docs in the same order. Resume with the corpus it was "
            "started on, or start a new run (--overwrite, or another output folder)."
        )
    _warn_of_other_batching(checkpoint, state, config, say=group.is_main)
    say = show_progress and group.is_main
    if say:
        tqdm.write(f"Resuming from {checkpoint} (step {state.step}, epoch {state.epoch})")
    if state.finished:
        reached = limits_reached(state, config)
        state.finished = bool(reached)
        if say:
            tqdm.write(
                f"The run had finished ({'; '.join(reached)}): nothing to train. To train "
                "further, raise that limit (--training.<name>)."
                if reached
                else "The run had finished; [training] now allows more, so it goes on."
            )
    return Start(bilm, optimizer, state, checkpoint)


def _new(
    corpus: Corpus,
    dev: Corpus | None,
    sample: DevSample,
    bilm_config: BiLMConfig,
    config: PretrainConfig,
    init_bilm: BiLM | None,
    init_vectors: Vectors | None,
    group: ProcessGroup,
) -> Start:
    """A new run: `init_bilm`, or a fresh biLM."""
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
        if group.is_main:
            _warn_of_oversized_clusters(bilm_config, bilm)
    bilm.tokenization = corpus.tokenization
    words = None
    if init_vectors is not None:
        words = bilm.init_word_vectors(_vectors(init_vectors))
    bilm.to(group.device)
    state = RunState(corpus=_fingerprint(corpus, dev), batching=batching_settings(config))
    return Start(bilm, new_optimizer(bilm, config), state, words_from_vectors=words)


def _training_data(
    corpus: Corpus, sample: DevSample, bilm: BiLM, config: PretrainConfig
) -> TrainingData:
    dev_spans = sample.spans(config.max_length)
    return TrainingData(
        corpus=corpus,
        dev=sample,
        dev_batches=ordered_batches(dev_spans, config.eval_batch_tokens),
        build=BatchBuilder(corpus, bilm),
        build_dev=BatchBuilder(sample.corpus, bilm),
        epoch_tokens=corpus.n_tokens - (dev_spans.tokens if sample.held_out else 0),
        dev_tokens=dev_spans.tokens,
    )


def _log(run: Pretraining, dev: Corpus | None, start: Start) -> dict[str, Any]:
    bilm, state, data = run.bilm, run.state, run.data
    return {
        "bilm": bilm.config.to_dict(),
        "training": asdict(run.config),
        "corpus": data.corpus.describe(),
        "dev": {
            "corpus": "held out of the corpus" if dev is None else dev.describe(),
            "docs": len(data.dev.docs),
            "tokens": data.dev_tokens,
            "held_out": data.dev.held_out or dev is not None,
        },
        "vocab_size": len(bilm.vocab),
        "softmax": {"cutoffs": bilm.softmax.cluster_starts, "div_value": bilm.softmax.div_value},
        "words_from_init_vectors": start.words_from_vectors,
        "init_dev_perplexity": state.init_dev_perplexity,
        "world_size": run.group.world_size,
        "ranks_by_folder": run.group.ranks_by_folder,
        "batch_tokens_scope": "one optimizer step, all ranks together",
        "precision": bilm.precision,
        "epochs": state.epochs,
        "evaluations": state.evaluations,
        "best_dev_perplexity": state.best,
        "steps": state.step,
        "tokens": state.tokens,
        "seconds_to_first_step": run.first_step,
        "wall_seconds": time.perf_counter() - run.started,
        "resumed_from": None if start.checkpoint is None else str(start.checkpoint),
    }


def _warn_of_oversized_clusters(bilm_config: BiLMConfig, bilm: BiLM) -> None:
    """Warn of a tail cluster of more than MAX_CLUSTER_WORDS words."""
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


def _bilm_to_train_further(
    init_bilm: BiLM | str | Path | None, bilm_config: BiLMConfig | None, init_vectors: Any
) -> tuple[BiLM | None, BiLMConfig]:
    """`init_bilm` (loaded, checked) and the run's [bilm] config."""
    if init_bilm is None:
        if bilm_config is None:
            raise ElmoSpacyError("A fresh biLM needs its [bilm] config: bilm_config is None")
        return None, bilm_config
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
    return init_bilm, init_bilm.config


def _vectors(vectors: Vectors) -> Mapping[str, numpy.ndarray]:
    """Word vectors: as given, or those of a spaCy pipeline or vectors folder."""
    if isinstance(vectors, Mapping):
        return vectors
    import spacy

    table = spacy.load(vectors).vocab.vectors
    return {table.strings[key]: table.data[row] for key, row in table.key2row.items()}


DEV_SETTINGS = ("seed", "dev_fraction", "max_dev_tokens")  # those that draw the dev sample
BATCHING_SETTINGS = (*DEV_SETTINGS, "max_length", "batch_tokens")


def batching_settings(config: PretrainConfig) -> dict[str, Any]:
    """The [training] settings that decide the dev sample and the batches."""
    return {name: getattr(config, name) for name in BATCHING_SETTINGS}


def _warn_of_other_batching(
    checkpoint: Path, state: RunState, config: PretrainConfig, say: bool = True
) -> None:
    """Warn where a resumed run batches otherwise than the run it resumes
    (`say`: rank 0 says it for all), and record the new settings."""
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
