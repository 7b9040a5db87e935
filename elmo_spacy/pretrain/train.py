"""The biLM training loop: Adam, gradient clipping, dev perplexity per epoch, early stopping."""

import json
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..bilm import BiLM, BiLMConfig, Vocab, save_bilm
from .batching import Tokens, bucketed_batches, split_long
from .config import PretrainConfig

LOG_FILE = "pretrain_log.json"


def pretrain(
    docs: Sequence[Tokens],
    bilm_config: BiLMConfig,
    config: PretrainConfig,
    output_dir: Path,
    progress: bool = True,
) -> dict[str, Any]:
    """Train a biLM on tokenised docs and write `model-best/`, `model-last/`
    (biLM directories) and `pretrain_log.json` to `output_dir`.

    A seeded `dev_fraction` of the docs is held out for perplexity; with
    dev_fraction = 0 perplexity is measured on the training docs (held-in).
    Returns the log: settings, per-epoch perplexities, tokens/s, wall time.
    """
    started = time.perf_counter()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    train_docs, dev_docs = _split_dev(docs, config.dev_fraction, rng)
    train_docs = split_long(train_docs, config.max_length)
    dev_docs = split_long(dev_docs, config.max_length) if dev_docs else train_docs
    if not train_docs:
        raise ValueError("No tokens to pretrain on: the pretraining text is empty.")
    vocab = Vocab.build(
        train_docs, max_size=bilm_config.max_vocab_size, min_count=bilm_config.min_count
    )
    bilm = BiLM(bilm_config, vocab)
    optimizer = torch.optim.Adam(bilm.parameters(), lr=config.learning_rate)
    log: dict[str, Any] = {
        "bilm": bilm_config.to_dict(),
        "training": config.to_dict(),
        "vocab_size": len(vocab),
        "train_docs": len(train_docs),
        "train_tokens": sum(len(d) for d in train_docs),
        "dev_docs": len(dev_docs),
        "dev_is_held_out": config.dev_fraction > 0,
        "epochs": [],
    }
    best, bad_epochs, step = math.inf, 0, 0
    for epoch in range(1, config.max_epochs + 1):
        stats = _train_epoch(bilm, optimizer, train_docs, config, rng, epoch, step, progress)
        step = stats["step"]
        perplexity = evaluate_perplexity(bilm, dev_docs, config.eval_batch_tokens)
        log["epochs"].append({"epoch": epoch, **stats, "dev_perplexity": perplexity})
        save_bilm(bilm, output_dir / "model-last")
        if perplexity["mean"] < best:
            best, bad_epochs = perplexity["mean"], 0
            save_bilm(bilm, output_dir / "model-best")
        else:
            bad_epochs += 1
        if progress:
            tqdm.write(
                f"epoch {epoch}: dev perplexity forward {perplexity['forward']:.1f}, "
                f"backward {perplexity['backward']:.1f}, mean {perplexity['mean']:.1f}; "
                f"{stats['tokens_per_second']:.0f} tokens/s"
            )
        if (config.patience and bad_epochs >= config.patience) or (
            config.max_steps and step >= config.max_steps
        ):
            break
    log["best_dev_perplexity"] = best
    log["wall_seconds"] = time.perf_counter() - started
    (output_dir / LOG_FILE).write_text(json.dumps(log, indent=2) + "\n")
    return log


def _train_epoch(
    bilm: BiLM,
    optimizer: torch.optim.Optimizer,
    docs: Sequence[Tokens],
    config: PretrainConfig,
    rng: random.Random,
    epoch: int,
    step: int,
    progress: bool,
) -> dict[str, Any]:
    bilm.train()
    batches = list(bucketed_batches(docs, config.batch_tokens, rng))
    n_tokens, nll, seconds = 0, 0.0, 0.0
    bar = tqdm(batches, desc=f"epoch {epoch}", disable=not progress, unit="batch")
    for batch in bar:
        started = time.perf_counter()
        loss = bilm.lm_loss(bilm.batch(batch))
        optimizer.zero_grad()
        loss.mean.backward()
        torch.nn.utils.clip_grad_norm_(bilm.parameters(), config.grad_clip)
        optimizer.step()
        seconds += time.perf_counter() - started
        step += 1
        n_tokens += loss.n_tokens
        nll += (loss.forward_nll + loss.backward_nll).item() / 2
        bar.set_postfix(
            loss=f"{nll / n_tokens:.3f}",
            ppl=f"{math.exp(min(nll / n_tokens, 50)):.1f}",
            tok_s=f"{n_tokens / seconds:.0f}",
        )
        if config.max_steps and step >= config.max_steps:
            break
    return {
        "step": step,
        "train_tokens": n_tokens,
        "train_perplexity": math.exp(min(nll / max(n_tokens, 1), 50)),
        "tokens_per_second": n_tokens / max(seconds, 1e-9),
    }


@torch.inference_mode()
def evaluate_perplexity(
    bilm: BiLM, docs: Sequence[Tokens], batch_tokens: int = 8000
) -> dict[str, float]:
    """Exact perplexity of `docs` per direction and their geometric mean.
    Every word and the closing (forwards) or opening (backwards) boundary counts."""
    was_training = bilm.training
    bilm.eval()
    forward, backward, n_tokens = 0.0, 0.0, 0
    for batch in bucketed_batches(docs, batch_tokens, random.Random(0), shuffle=False):
        loss = bilm.lm_loss(bilm.batch(batch))
        forward += float(loss.forward_nll)
        backward += float(loss.backward_nll)
        n_tokens += loss.n_tokens
    bilm.train(was_training)
    n_tokens = max(n_tokens, 1)
    return {
        "forward": math.exp(forward / n_tokens),
        "backward": math.exp(backward / n_tokens),
        "mean": math.exp((forward + backward) / (2 * n_tokens)),
    }


def _split_dev(
    docs: Sequence[Tokens], fraction: float, rng: random.Random
) -> tuple[list[Tokens], list[Tokens]]:
    docs = [d for d in docs if len(d)]
    if fraction <= 0:
        return docs, []
    order = list(range(len(docs)))
    rng.shuffle(order)
    n_dev = max(1, int(round(len(docs) * fraction)))
    dev = set(order[:n_dev])
    return [d for i, d in enumerate(docs) if i not in dev], [docs[i] for i in sorted(dev)]
