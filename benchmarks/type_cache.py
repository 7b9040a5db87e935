"""Words/s of a character-CNN biLM at inference with and without the cache of
token-type encodings, in one run.

    python benchmarks/type_cache.py configs/bilm.cfg corpus/dev.spacy [--passes 2] [--batch-tokens 4096]

The biLM has the sizes of the config with `encoder = "char_cnn"` and fresh
weights (speed does not depend on what they are). The docs go through in
length-sorted batches of at most `--batch-tokens` padded tokens, as the `elmo`
pipe runs them, `--passes` times over. Within a batch each distinct token is
encoded once either way; the cache also keeps encodings across batches.
Prints one JSON line per setting and pass.
"""

import argparse
import json
import random
import time

import spacy
import torch
from spacy.tokens import DocBin

from elmo_spacy.bilm import BiLM, WordVocab
from elmo_spacy.pretrain import bucketed_batches, load_pretrain_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="A pretraining config; its [bilm] sizes are used")
    parser.add_argument("docs", help="A .spacy file of docs")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    args = parser.parse_args()
    config, _ = load_pretrain_config(args.config, {"bilm.encoder": "char_cnn"})
    strings = spacy.blank("en").vocab
    docs = [[t.text for t in doc] for doc in DocBin().from_disk(args.docs).get_docs(strings)]
    batches = list(bucketed_batches(docs, args.batch_tokens, random.Random(0), shuffle=False))
    n_words = sum(len(doc) for doc in docs)
    vocab = WordVocab.build(docs, max_size=config.max_vocab_size, min_count=config.min_count)
    torch.manual_seed(0)
    weights = BiLM(config, vocab).state_dict()
    for size in (0, 100_000):
        bilm = BiLM(config, vocab, type_cache_size=size)
        bilm.load_state_dict(weights)
        bilm.eval()
        with torch.inference_mode():
            bilm(bilm.batch(batches[0]))  # warm-up
            bilm.clear_type_cache()
            for n_pass in range(1, args.passes + 1):
                started = time.perf_counter()
                for batch in batches:
                    bilm(bilm.batch(batch))
                seconds = time.perf_counter() - started
                result = {
                    "type_cache_size": size,
                    "pass": n_pass,
                    "words": n_words,
                    "batches": len(batches),
                    "torch_threads": torch.get_num_threads(),
                    "words_per_second": round(n_words / seconds),
                    "cached_types": len(bilm._type_cache),
                }
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
