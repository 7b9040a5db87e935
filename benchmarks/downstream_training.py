"""Wall time per epoch of training a textcat on a frozen biLM, with the `elmo`
pipe's output cache off and on, in one run.

    python benchmarks/downstream_training.py configs/textcat_scalar.cfg training/bilm/model-best corpus/train.spacy [--docs 4000] [--epochs 3]

For each setting (`components.elmo.cache_mb` 0, then the config's), the
pipeline is initialised from the config, then trained for `--epochs` passes
over the first `--docs` training docs with the config's batcher, optimiser and
dropout (no evaluation in between). Prints one JSON line per setting: seconds
per epoch, the ratio of the first epoch to the mean of the later ones, and the
cache's hits and size; then the speed-up of later epochs over the uncached run.
"""

import argparse
import json
import random
import time

import spacy
from spacy.training import Corpus
from spacy.training.initialize import init_nlp
from spacy.util import load_config, registry


def train_epochs(config_path: str, bilm: str, train: str, cache_mb: int | None, args) -> dict:
    overrides = {"paths.bilm": bilm, "paths.train": train, "paths.dev": train}
    if cache_mb is not None:
        overrides["components.elmo.cache_mb"] = cache_mb
    config = load_config(config_path, overrides=overrides, interpolate=True)
    nlp = init_nlp(config)
    examples = list(Corpus(train)(nlp))[: args.docs]
    batcher = registry.resolve({"batcher": config["training"]["batcher"]})["batcher"]
    optimizer = nlp.create_optimizer()
    dropout = config["training"]["dropout"]
    rng = random.Random(0)
    seconds = []
    for _ in range(args.epochs):
        rng.shuffle(examples)
        started = time.perf_counter()
        for batch in batcher(examples):
            nlp.update(batch, sgd=optimizer, drop=dropout)
        seconds.append(time.perf_counter() - started)
    cache = nlp.get_pipe("elmo").frozen_cache
    later = sum(seconds[1:]) / max(len(seconds) - 1, 1)
    return {
        "cache_mb": cache.max_size // 2**20,
        "docs": len(examples),
        "words": sum(len(eg.reference) for eg in examples),
        "epoch_seconds": [round(s, 1) for s in seconds],
        "first_over_later": round(seconds[0] / later, 2),
        "cache_hits": cache.hits,
        "cache_entries": len(cache),
        "cache_mb_used": round(cache.size / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="A textcat config on the elmo pipe, biLM frozen")
    parser.add_argument("bilm", help="The pretrained biLM directory")
    parser.add_argument("train", help="A .spacy file of training docs")
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    spacy.require_cpu()
    results = [train_epochs(args.config, args.bilm, args.train, mb, args) for mb in (0, None)]
    for result in results:
        print(json.dumps(result), flush=True)
    uncached, cached = (r["epoch_seconds"] for r in results)
    later = sum(cached[1:]) / max(len(cached) - 1, 1)
    print(
        f"later epochs: {later:.1f} s cached vs {sum(uncached) / len(uncached):.1f} s uncached "
        f"({sum(uncached) / len(uncached) / later:.2f}x); first cached epoch {cached[0]:.1f} s "
        f"({cached[0] / later:.2f}x a later one)"
    )


if __name__ == "__main__":
    main()
