"""Words/s of an `elmo` pipe with a character-CNN biLM, through `nlp.pipe`, with
and without the biLM's cache of token-type encodings, in one run.

    python benchmarks/type_cache.py [BILM_DIR] [--text ../shared/data/ag_news/train.csv] [--docs 1000] [--passes 2]

BILM_DIR: a char-CNN biLM (e.g. from `elmo-spacy convert-elmo`); without it, a
biLM of fresh weights at `configs/bilm_elmo.cfg` sizes (speed does not depend on
what the weights are). The texts are the first `--docs` rows of an AG News CSV.
Each setting gets its own pipeline (the same weights) and runs `--passes` times
over the texts; the cache keeps encodings across batches and passes. Prints
one JSON line per setting and pass, then the ratios.
"""

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import spacy
import torch

from elmo_spacy.bilm import BiLM, WordVocab, save_bilm
from elmo_spacy.layers import get_bilm
from elmo_spacy.pretrain import load_pretrain_config

ROOT = Path(__file__).parent.parent


def read_texts(path: Path, n: int) -> list[str]:
    with path.open(encoding="utf-8") as lines:
        rows = [" ".join(row[1:]).replace("\\", " ") for _, row in zip(range(n), csv.reader(lines))]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bilm", nargs="?", type=Path, help="A char-CNN biLM directory")
    parser.add_argument("--text", type=Path, default=ROOT.parent / "shared/data/ag_news/train.csv")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    texts = read_texts(args.text, args.docs)
    with tempfile.TemporaryDirectory() as scratch:
        bilm_dir = args.bilm
        if bilm_dir is None:
            config, _ = load_pretrain_config(ROOT / "configs" / "bilm_elmo.cfg")
            torch.manual_seed(0)
            bilm_dir = save_bilm(
                BiLM(config, WordVocab.specials_only(), with_softmax=False), Path(scratch) / "bilm"
            )
        words = sum(len(doc) for doc in spacy.blank("en").tokenizer.pipe(texts))
        speed = {}
        for cache_size in (0, 100_000):
            nlp = spacy.blank("en")
            nlp.add_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
            bilm = get_bilm(nlp.get_pipe("elmo").model)
            bilm.type_cache_size = cache_size
            for n_pass in range(1, args.passes + 1):
                started = time.perf_counter()
                for _ in nlp.pipe(texts, batch_size=128):
                    pass
                seconds = time.perf_counter() - started
                speed[cache_size, n_pass] = words / seconds
                line = {
                    "type_cache_size": cache_size,
                    "pass": n_pass,
                    "words": words,
                    "words_per_second": round(words / seconds),
                    "cached_types": bilm.cache_info()["types"],
                }
                print(json.dumps(line), flush=True)
        ratios = {
            f"pass_{p}_cached_over_uncached": round(speed[100_000, p] / speed[0, p], 2)
            for p in range(1, args.passes + 1)
        }
        print(json.dumps(ratios), flush=True)


if __name__ == "__main__":
    main()
