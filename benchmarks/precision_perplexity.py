"""Dev perplexity after the same pretraining steps in float32 and in bfloat16.

    python benchmarks/precision_perplexity.py configs/bilm.cfg ../shared/data/ag_news/unlabeled.txt
        [--steps 300] [--precisions float32 bfloat16] [--threads 2]
        [--output-dir /tmp/precision_perplexity] [--gpu-id -1] [--kernel auto]
        [--bilm.lstm_dim 4096 ...: overrides of the config, as `elmo-spacy pretrain` takes them]

Pretrains the config's biLM once per precision (`[training] precision`), from
the same initial weights on the same batches, for `--steps` steps (as many
epochs as that takes, dev perplexity measured at each epoch's end and after
the last step), then measures the dev perplexity of each run's last weights
in float32 and in bfloat16 (on the LSTM kernel `--kernel` names: "auto",
pretraining's own choice, or training, fused or loop), so that the effect of
training in bfloat16 and the effect of evaluating in it are told apart. The corpus is a prepared
folder or a text (prepared into OUTPUT_DIR/corpus); the dev sample is the
config's (dev_fraction, max_dev_tokens, seed), as `elmo-spacy pretrain`
draws it.

Prints one JSON line per run (tokens/s, wall time, dev perplexity in its own
precision and in each) and a summary: each run's dev perplexity (evaluated in
float32) relative to the float32 run's. The issue's target: within 1%.
"""

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from kernel_choice import force_kernel
from spacy.cli._util import parse_config_overrides

from elmo_spacy.bilm import BiLM, load_bilm
from elmo_spacy.pretrain import evaluate_perplexity, load_pretrain_config, open_corpus, pretrain
from elmo_spacy.pretrain.batches import (
    BatchBuilder,
    corpus_vocabulary,
    dev_sample,
    ordered_batches,
)
from elmo_spacy.pretrain.distributed import join_process_group

PRECISIONS = ("float32", "bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("corpus", help="A prepared corpus, or a text file (prepared first)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per precision")
    parser.add_argument(
        "--precisions", nargs="*", default=list(PRECISIONS), choices=(*PRECISIONS, "float16")
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, default=Path("/tmp/precision_perplexity"))
    parser.add_argument("--gpu-id", type=int, default=-1, help="a CUDA GPU to train on (-1: CPU)")
    parser.add_argument("--kernel", default="auto", help="the LSTM kernel to train on")
    args, extra = parser.parse_known_args()
    torch.set_num_threads(args.threads)

    bilm_config, training = load_pretrain_config(args.config, parse_config_overrides(extra))
    corpus = open_corpus([args.corpus], args.output_dir / "corpus")
    settings = replace(
        training, max_steps=args.steps, max_epochs=10_000, patience=0, checkpoint_every=0
    )
    sample = dev_sample(corpus, settings.dev_fraction, settings.max_dev_tokens, settings.seed)
    dev = ordered_batches(sample.spans(settings.max_length), settings.eval_batch_tokens)
    force_kernel(None if args.kernel == "auto" else args.kernel)
    results = {}
    for precision in args.precisions:
        output = args.output_dir / precision
        torch.manual_seed(settings.seed)  # the same initial weights in each precision
        vocab = corpus_vocabulary(
            corpus.types, bilm_config.max_vocab_size, bilm_config.min_count, held_out=sample
        )  # pretraining's own
        bilm = BiLM(bilm_config, vocab)
        started = time.perf_counter()
        log = pretrain(
            corpus,
            bilm_config,
            replace(settings, precision=precision),
            output,
            show_progress=False,
            overwrite=True,
            init_bilm=bilm,
            group=join_process_group(args.gpu_id),
        )
        wall = time.perf_counter() - started
        line = {
            "precision": log["precision"],
            "lstm_kernel": args.kernel,
            "steps": log["steps"],
            "epochs": len(log["epochs"]),
            "wall_seconds": round(wall, 1),
            "train_tokens_per_second": round(
                sum(e["train_tokens"] for e in log["epochs"])
                / sum(e["train_tokens"] / e["tokens_per_second"] for e in log["epochs"])
            ),
            "dev_perplexity_own_precision": log["epochs"][-1]["dev_perplexity"]["mean"],
        }
        for evaluated_in in dict.fromkeys([*PRECISIONS, precision]):
            bilm = load_bilm(output / "model-last").to(join_process_group(args.gpu_id).device)
            bilm.precision = evaluated_in
            build = BatchBuilder(corpus, bilm)
            perplexity = evaluate_perplexity(bilm, map(build, dev))
            line[f"dev_perplexity_in_{evaluated_in}"] = perplexity["mean"]
        results[precision] = line
        print(json.dumps(line), flush=True)
    if "float32" in results:
        reference = results["float32"]["dev_perplexity_in_float32"]
        print(
            json.dumps(
                {
                    f"{p}_dev_perplexity_over_float32": round(
                        r["dev_perplexity_in_float32"] / reference, 4
                    )
                    for p, r in results.items()
                }
                | {
                    f"{p}_train_speed_over_float32": round(
                        r["train_tokens_per_second"]
                        / results["float32"]["train_tokens_per_second"],
                        2,
                    )
                    for p, r in results.items()
                }
            )
        )


if __name__ == "__main__":
    main()
