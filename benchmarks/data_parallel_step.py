"""The data-parallel training step with and without DistributedDataParallel's
search for unused parameters.

    elmo-spacy prepare TEXT CORPUS
    torchrun --standalone --nproc_per_node 2 benchmarks/data_parallel_step.py \
        configs/bilm.cfg CORPUS [--steps 20] [--rounds 2] [--bilm.lstm_dim 1024 ...]

Every rank builds the biLM of the config (its vocabulary from the prepared
CORPUS) and its share of the same batches (the first epoch's first ones), as
pretraining does; then alternately, --rounds times, times --steps steps
(after two warm-up steps) of each:

- "search": DistributedDataParallel(find_unused_parameters=True), the loss
  leaving a tail cluster of the adaptive softmax unused where a share has
  none of its words: DDP walks the autograd graph after every forward pass
  to find such parameters;
- "every parameter": find_unused_parameters=False, the loss giving every
  parameter a gradient, zero where unused (`SoftmaxHead.forward`'s
  every_parameter): what pretraining runs.

Rank 0 prints one JSON line per round and mode (ms per step, tokens/s) and
the ratio of the medians.
"""

import argparse
import itertools
import json
import statistics
import time

import numpy
import torch
from spacy.cli._util import parse_config_overrides
from torch.nn.parallel import DistributedDataParallel

from elmo_spacy.bilm import BiLM
from elmo_spacy.pretrain import join_process_group, leave_process_group, load_pretrain_config
from elmo_spacy.pretrain.batches import BatchBuilder, corpus_vocabulary, epoch_batches
from elmo_spacy.pretrain.checkpoint import new_optimizer
from elmo_spacy.pretrain.corpus import Corpus
from elmo_spacy.pretrain.loop import RankLoss, training_step


def searched_loss(bilm: BiLM, world_size: int) -> RankLoss:
    """The share's loss without the zero terms: parameters can go unused."""
    loss = RankLoss(bilm, world_size)
    loss.every_parameter = False
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("corpus", help="a prepared corpus folder (elmo-spacy prepare)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args, extra = parser.parse_known_args()
    bilm_config, config = load_pretrain_config(args.config, parse_config_overrides(extra))
    group = join_process_group(-1)
    torch.manual_seed(config.seed)
    corpus = Corpus.open([args.corpus])
    vocab = corpus_vocabulary(corpus.types, bilm_config.max_vocab_size, bilm_config.min_count)
    bilm = BiLM(bilm_config, vocab)
    bilm.train()
    build = BatchBuilder(corpus, bilm)
    plans = epoch_batches(
        corpus,
        seed=config.seed,
        epoch=0,
        max_length=config.max_length,
        batch_tokens=config.batch_tokens,
        exclude=numpy.zeros(0, dtype="int64"),
    )
    batches = []  # (this rank's share, the whole batch's predictions), as `Prefetcher` makes them
    for spans in itertools.islice(plans, args.steps + 2):
        share = spans.take(slice(group.rank, None, group.world_size))
        batches.append((build(share if len(share) else spans.take(slice(0, 1))), spans))
    modes = {
        "search": lambda: DistributedDataParallel(
            searched_loss(bilm, group.world_size), find_unused_parameters=True
        ),
        "every parameter": lambda: DistributedDataParallel(
            RankLoss(bilm, group.world_size), find_unused_parameters=False
        ),
    }
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(args.rounds):
        for mode, make in modes.items():
            loss = make()
            optimizer = new_optimizer(bilm, config)
            for batch, spans in batches[:2]:
                training_step(loss, optimizer, config.grad_clip, batch, spans.predictions)
            group.wait_for_all()
            started = time.perf_counter()
            for batch, spans in batches[2:]:
                training_step(loss, optimizer, config.grad_clip, batch, spans.predictions)
            group.wait_for_all()
            seconds = time.perf_counter() - started
            times[mode].append(seconds / args.steps)
            if group.is_main:
                tokens = sum(spans.predictions for _, spans in batches[2:])
                print(
                    json.dumps(
                        {
                            "round": round_,
                            "mode": mode,
                            "ms_per_step": round(1000 * seconds / args.steps, 1),
                            "tokens_per_second": round(tokens / seconds),
                            "world_size": group.world_size,
                        }
                    ),
                    flush=True,
                )
    if group.is_main:
        search, every = (statistics.median(times[mode]) for mode in modes)
        print(json.dumps({"search_over_every_parameter": round(search / every, 3)}))
    leave_process_group(group)


if __name__ == "__main__":
    main()
