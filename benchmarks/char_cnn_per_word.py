"""A pretraining step with the char CNN run once per distinct word of the
batch (what `BiLM.batch` and pretraining's batches do) against once per
token (tests/batches.py's `per_token`), on the same batches, CPU.

    python benchmarks/char_cnn_per_word.py [--shapes original ner] [--steps 4] [--text FILE]

Shapes: "original" is ELMo's char-CNN biLM (2x4096_512, 2,048 filters, two
highway layers); "ner" the ner workflow's word+char biLM (configs/bilm.cfg
with encoder word_char, 512 / 128). Batches of --batch-tokens tokens of the
text (default: AG News unlabeled text beside the repository, else the
plugin's sample text), split on white space. Each variant runs --steps
training steps (`training_step`: forward, backward, clipping, Adam) after
one warm-up step, alternating; prints one JSON line per shape with both
rates and their ratio.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import spacy
import torch
from elmo_shapes import SHAPES, elmo_config

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab
from elmo_spacy.pretrain import PretrainConfig, load_pretrain_config
from elmo_spacy.pretrain.checkpoint import new_optimizer
from elmo_spacy.pretrain.loop import RankLoss, training_step

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))  # tests/batches.py's per_token
from tests.batches import per_token  # noqa: E402

AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news" / "unlabeled.txt"


def config_of(shape: str) -> BiLMConfig:
    if shape == "original":
        return elmo_config(**SHAPES["original 2x4096_512"])
    bilm, _ = load_pretrain_config(ROOT / "configs" / "bilm.cfg")
    settings = {**bilm.to_dict(), "encoder": "word_char", "lstm_dim": 512, "projection_dim": 128}
    return BiLMConfig(**settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=["original", "ner"], default=["ner"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-tokens", type=int, default=3000)
    parser.add_argument("--text", type=Path, default=AG_NEWS if AG_NEWS.is_file() else None)
    args = parser.parse_args()
    text = args.text or Path(spacy.util.get_package_path("elmo_spacy")) / "data" / "sample.txt"
    lines = [line.split() for line in text.read_text(encoding="utf-8").splitlines()]
    docs = [line[:200] for line in lines if line]
    for shape in args.shapes:
        torch.manual_seed(0)
        config = config_of(shape)
        vocab = WordVocab.build(docs, max_size=config.max_vocab_size, min_count=2)
        bilm = BiLM(config, vocab)
        batches, batch, size = [], [], 0
        for doc in docs:
            batch.append(doc)
            size += len(doc)
            if size >= args.batch_tokens:
                batches.append(bilm.batch(batch).with_targets(bilm.softmax.cluster_starts))
                batch, size = [], 0
            if len(batches) == args.steps + 1:
                break
        steps = len(batches) - 1
        if steps < 1:
            raise SystemExit(
                f"{text}: too little text for two batches of {args.batch_tokens} tokens"
            )
        variants = {"once per word": batches, "once per token": [per_token(b) for b in batches]}
        optimizer = new_optimizer(bilm, PretrainConfig())
        loss = RankLoss(bilm, world_size=1)
        bilm.train()
        seconds = dict.fromkeys(variants, 0.0)
        for step in range(steps + 1):
            for name, runs in variants.items():
                started = time.perf_counter()
                training_step(loss, optimizer, 5.0, runs[step], runs[step].targets.n_tokens)
                if step:  # the first is the warm-up
                    seconds[name] += time.perf_counter() - started
        tokens = sum(int(b.lengths.sum()) for b in batches[1:])
        line = {
            "shape": shape,
            "steps": steps,
            "tokens": tokens,
            "distinct_words_per_batch": round(
                sum(len(b.type_inputs) - 2 for b in batches[1:]) / steps
            ),
            "tokens_per_batch": round(tokens / steps),
        }
        for name, spent in seconds.items():
            line[f"tokens_per_second_{name.replace(' ', '_')}"] = round(tokens / spent)
        line["ratio"] = round(seconds["once per token"] / seconds["once per word"], 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
