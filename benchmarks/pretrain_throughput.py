"""Throughput of the biLM training step, against this machine's matmul rate, measured in the same run.

    python benchmarks/pretrain_throughput.py configs/bilm.cfg corpus/pretrain.txt [--steps 30]

Prints, one line each: the float32 matmul rate (GFLOP/s, the roofline), then
for the config as given and for the same model with a full softmax (the
naive baseline): tokens/s, training FLOPs per token computed from the sizes
(3x the forward FLOPs of the matmuls, on real tokens, not padding), and the
share of the roofline reached.
"""

import argparse
import itertools
import json
import random
import time
from dataclasses import replace

import torch

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab
from elmo_spacy.pretrain import bucketed_batches, load_pretrain_config, split_long
from elmo_spacy.pretrain.texts import read_tokenised_texts


def matmul_gflops(n: int = 2048, repeats: int = 10) -> float:
    """Measured float32 matmul rate of (n x n) @ (n x n), GFLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    started = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * n**3 * repeats / (time.perf_counter() - started) / 1e9


def forward_flops_per_token(config: BiLMConfig, vocab_size: int, tail_shares: list[float]) -> float:
    """Matmul FLOPs of one token's forward pass: token encoder, both LSTM stacks,
    and the softmax of both directions. `tail_shares[i]` is the share of targets
    in adaptive-softmax tail cluster i."""
    p, h = config.projection_dim, config.lstm_dim
    encoder = 2 * config.word_dim * p if config.encoder == "word" else 0.0  # char CNN: not counted
    lstm_layer = 2 * 4 * h * (p + p) + 2 * h * p  # gates from input and projected state, projection
    lstm = 2 * config.n_layers * lstm_layer
    if config.softmax == "full":
        softmax = 2 * p * vocab_size
    else:
        bounds = [*config.cutoffs, vocab_size]
        softmax = 2 * p * (bounds[0] + len(config.cutoffs))
        for i, share in enumerate(tail_shares):
            width = p // 4 ** (i + 1)  # div_value = 4
            softmax += share * (2 * p * width + 2 * width * (bounds[i + 1] - bounds[i]))
    return encoder + lstm + 2 * softmax


def train_steps(bilm: BiLM, batches: list, steps: int) -> float:
    """Tokens/s of forward, backward, clipping and an Adam step, after a warm-up."""
    optimizer = torch.optim.Adam(bilm.parameters(), lr=1e-3)
    bilm.train()
    tokens, seconds = 0, 0.0
    for i, docs in enumerate(itertools.islice(itertools.cycle(batches), steps + 3)):
        started = time.perf_counter()
        loss = bilm.lm_loss(bilm.batch(docs))
        optimizer.zero_grad()
        loss.mean.backward()
        torch.nn.utils.clip_grad_norm_(bilm.parameters(), 5.0)
        optimizer.step()
        if i >= 3:
            seconds += time.perf_counter() - started
            tokens += loss.n_tokens
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("text")
    parser.add_argument("--steps", type=int, default=30, help="Timed training steps per model")
    args = parser.parse_args()

    bilm_config, training = load_pretrain_config(args.config)
    docs = split_long(read_tokenised_texts(args.text), training.max_length)  # as pretraining does
    vocab = WordVocab.build(
        docs, max_size=bilm_config.max_vocab_size, min_count=bilm_config.min_count
    )  # as pretraining builds it, so the softmax has its real size
    ids = [vocab.index.get(w, 1) for d in docs for w in d]
    bounds = [*bilm_config.cutoffs, len(vocab)]
    tail_shares = [sum(lo <= i < hi for i in ids) / len(ids) for lo, hi in zip(bounds, bounds[1:])]
    batches = list(bucketed_batches(docs, training.batch_tokens, random.Random(0)))

    roofline = matmul_gflops()
    print(json.dumps({"threads": torch.get_num_threads(), "matmul_gflops": round(roofline, 1)}))
    for name, config in (
        ("as configured", bilm_config),
        ("full softmax", replace(bilm_config, softmax="full")),
    ):
        torch.manual_seed(0)
        tokens_per_second = train_steps(BiLM(config, vocab), batches, args.steps)
        flops = 3 * forward_flops_per_token(config, len(vocab), tail_shares)
        print(
            json.dumps(
                {
                    "model": name,
                    "vocab": len(vocab),
                    "tokens_per_second": round(tokens_per_second),
                    "train_mflops_per_token": round(flops / 1e6, 2),
                    "gflops": round(tokens_per_second * flops / 1e9, 1),
                    "share_of_roofline": round(tokens_per_second * flops / 1e9 / roofline, 3),
                }
            )
        )


if __name__ == "__main__":
    main()
