"""Throughput of the biLM training step in each precision, against this machine's matmul rates, measured in the same run.

    python benchmarks/pretrain_throughput.py configs/bilm.cfg CORPUS [--steps 30]
        [--precisions float32 bfloat16] [--no-full-softmax] [--threads 2]
        [--kernels training fused loop] [--feeds built prepared]
        [--device cpu] [--fresh-pages] [--profile STEPS]
        [--bilm.lstm_dim 2048 ...: overrides of the config, as `elmo-spacy pretrain` takes them]

Prints, one line each: the matmul rates (GFLOP/s: MKL's float32 for
reference, oneDNN's float32 and bfloat16, the rooflines; on a CUDA GPU
(--device cuda, TF32 off), cuBLAS's float32 and bfloat16; see
benchmarks/matmul_rates.py), then for the config as given and for the same
model with a full softmax (the naive baseline), in each precision: tokens/s,
training FLOPs per token computed from the sizes (3x the forward FLOPs of the
matmuls, on real tokens, not padding; the char CNN's not counted), and the
share of the precision's own roofline reached, on each LSTM kernel asked for
(default: the CPU's training kernel; on a GPU cuDNN's, "fused", as
pretraining runs there unclipped, and the training kernel, its steps
Triton's, as it runs there clipped; "loop": the written-out recurrence under
autograd; "fused" ignores the clips), from each feed asked for (batches built
beforehand and kept on the device, or built from the prepared corpus in a
thread, as pretraining feeds its step); the milliseconds per step (on the
CPU of its forward (loss included), backward (clipping included) and
optimizer phases; on a GPU of the whole step, with no wait between steps, as
pretraining runs them), Adam's state and on a GPU the peak of allocated
memory (with --profile, then torch.profiler's operators over that many more
steps and three warm-up steps, by their own time, on the GPU where there is
one); last, each run's speed over float32's on each kernel. Dev perplexity after the same steps in
each precision: benchmarks/precision_perplexity.py.
"""

import argparse
import itertools
import json
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import numpy
import torch
from kernel_choice import force_kernel
from matmul_rates import float32_without_tf32, matmul_rates, roofline, synchronize
from spacy.cli._util import parse_config_overrides

from elmo_spacy.bilm import BiLM, BiLMConfig, TokenBatch
from elmo_spacy.pretrain import PretrainConfig, load_pretrain_config, open_corpus
from elmo_spacy.pretrain.batches import (
    BatchBuilder,
    Prefetcher,
    Spans,
    corpus_vocabulary,
    epoch_batches,
    word_ids_of_types,
)
from elmo_spacy.pretrain.checkpoint import new_optimizer
from elmo_spacy.pretrain.distributed import ProcessGroup
from elmo_spacy.pretrain.loop import RankLoss, training_step
from elmo_spacy.pretrain.memory import keep_freed_memory


def forward_flops_per_token(config: BiLMConfig, vocab_size: int, tail_shares: list[float]) -> float:
    """Matmul FLOPs of one token's forward pass: token encoder, both LSTM stacks,
    and the softmax of both directions. `tail_shares[i]` is the share of targets
    in adaptive-softmax tail cluster i."""
    p, h = config.projection_dim, config.lstm_dim
    cutoffs = used_cutoffs(config, vocab_size)
    encoder = 2 * config.word_dim * p if config.encoder == "word" else 0.0  # char CNN: not counted
    lstm_layer = 2 * 4 * h * (p + p) + 2 * h * p  # gates from input and projected state, projection
    lstm = 2 * config.n_layers * lstm_layer
    if config.softmax == "full":
        softmax = 2 * p * vocab_size
    else:
        bounds = [*cutoffs, vocab_size]
        softmax = 2 * p * (bounds[0] + len(cutoffs))
        for i, share in enumerate(tail_shares):
            width = int(p // config.div_value ** (i + 1))  # as nn.AdaptiveLogSoftmaxWithLoss
            softmax += share * (2 * p * width + 2 * width * (bounds[i + 1] - bounds[i]))
    return encoder + lstm + 2 * softmax


def used_cutoffs(config: BiLMConfig, vocab_size: int) -> list[int]:
    """The cutoffs the softmax keeps: those inside the vocabulary (`SoftmaxHead`)."""
    return [c for c in config.cutoffs if 0 < c < vocab_size - 1]


def train_steps(
    bilm: BiLM, feed: Callable[[int], Iterable[TokenBatch]], steps: int, training: PretrainConfig
) -> dict:
    """Pretraining's own step (`training_step`: forward, backward, clipping
    and Adam) over `feed(steps + 3)`'s batches, the first 3 a warm-up, in
    the biLM's precision: tokens/s (`tokens_per_second`), milliseconds per
    step (`ms_per_step`: on the CPU by phase, timed by hooks: `forward`, both
    stacks and the softmax loss, `backward`, with the clipping, `optimizer`,
    Adam; on a GPU the whole step, timed over all steps with no wait in
    between, as pretraining runs them), the optimizer's state
    (`optimizer_state_mb`) and on a GPU the peak of allocated memory
    (`peak_device_mb`)."""
    optimizer = new_optimizer(bilm, training)
    loss = RankLoss(bilm, world_size=1)
    device = next(bilm.parameters()).device
    on_gpu = device.type == "cuda"
    scaler = torch.amp.GradScaler(device.type) if bilm.precision == "float16" else None
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    bilm.train()
    tokens = 0
    phases = dict.fromkeys(("step",) if on_gpu else PHASES, 0.0)
    marks: list[float] = []

    def mark(*_) -> None:
        marks.append(_clock(device))

    if not on_gpu:  # the ends of the forward pass and of the backward pass and clipping
        loss.register_forward_hook(mark)
        optimizer.register_step_pre_hook(mark)
    started = 0.0
    for i, batch in enumerate(feed(steps + 3)):
        if i == 3:
            started = _clock(device)
        marks[:] = [_clock(device)] if not on_gpu else []
        predictions = batch.targets.n_tokens
        training_step(loss, optimizer, training.grad_clip, batch, predictions, scaler=scaler)
        if not on_gpu:
            mark()
        if i >= 3:
            for phase, start, end in zip(PHASES, marks, marks[1:]):
                phases[phase] += end - start
            tokens += predictions
    if on_gpu:
        phases["step"] = _clock(device) - started
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return {
        "tokens_per_second": round(tokens / sum(phases.values())),
        "ms_per_step": {k: round(1e3 * v / steps, 1) for k, v in phases.items()},
        "optimizer_state_mb": round(sum(t.numel() * t.element_size() for t in state) / 2**20),
        **(
            {"peak_device_mb": round(torch.cuda.max_memory_allocated(device) / 2**20)}
            if on_gpu
            else {}
        ),
    }


def profiled_steps(
    bilm: BiLM, feed: Callable[[int], Iterable[TokenBatch]], steps: int, training: PretrainConfig
):
    """torch.profiler's operators (its `key_averages()`; on a GPU, the
    device's kernels too) over `steps` training steps and `train_steps`'
    warm-up."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if next(bilm.parameters()).device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiled:
        train_steps(bilm, feed, steps, training)
    return profiled.key_averages()


def _built_feed(batches: list[TokenBatch]) -> Callable[[int], Iterable[TokenBatch]]:
    return lambda n: itertools.islice(itertools.cycle(batches), n)


def _prepared_feed(
    plans: list[Spans], build: BatchBuilder, group: ProcessGroup
) -> Callable[[int], Iterable[TokenBatch]]:
    """As pretraining feeds its step: each batch built from the corpus in a
    thread, ahead of the step (on a GPU in pinned memory, copied as the step
    takes it)."""

    def feed(n: int) -> Iterator[TokenBatch]:
        with Prefetcher(itertools.islice(itertools.cycle(plans), n), build, group) as batches:
            for batch, _spans, _weight in batches:
                yield batch

    return feed


def first_epoch(corpus, training: PretrainConfig) -> Iterator[Spans]:
    """The first epoch's batches of the whole corpus (seed 0), planned as
    pretraining plans them with `training`'s settings."""
    return epoch_batches(
        corpus,
        seed=0,
        epoch=1,
        max_length=training.max_length,
        batch_tokens=training.batch_tokens,
        exclude=numpy.zeros(0, dtype="int64"),
    )


def _clock(device: torch.device) -> float:
    synchronize(device)
    return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("corpus", help="A prepared corpus, or a text file (prepared first)")
    parser.add_argument("--steps", type=int, default=30, help="Timed training steps per model")
    parser.add_argument(
        "--precisions", nargs="*", default=list(PRECISIONS), choices=(*PRECISIONS, "float16")
    )
    parser.add_argument("--no-full-softmax", action="store_true", help="Skip the naive baseline")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kernels",
        nargs="*",
        choices=tuple(LSTM_KERNELS),
        help="LSTM kernels to time, each in each precision (default: training; "
        "on a GPU fused and training)",
    )
    parser.add_argument(
        "--feeds",
        nargs="+",
        default=["built"],
        choices=tuple(FEEDS),
        help="Where the step's batches come from: built beforehand (the default), and/or "
        "built from the prepared corpus as pretraining builds them",
    )
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N)")
    parser.add_argument(
        "--fresh-pages",
        action="store_true",
        help="Leave glibc's allocator as it is (freed arrays go back to the OS), "
        "not as `elmo-spacy pretrain` sets it",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="Then profile this many steps of each run and print the operators' times",
    )
    args, extra = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    float32_without_tf32()
    if not args.fresh_pages:
        keep_freed_memory()  # as `elmo-spacy pretrain` runs

    # Config overrides as the pretrain command takes them: --bilm.lstm_dim 2048
    bilm_config, training = load_pretrain_config(args.config, parse_config_overrides(extra))
    # a text file is prepared into a folder removed at exit
    workdir = tempfile.TemporaryDirectory(prefix="pretrain-throughput-")
    corpus = open_corpus([args.corpus], workdir.name)
    vocab = corpus_vocabulary(corpus.types, bilm_config.max_vocab_size, bilm_config.min_count)
    # the share of tokens in each adaptive-softmax cluster, from the type counts
    word_ids = word_ids_of_types(corpus.types, vocab)
    counts = numpy.bincount(word_ids, weights=corpus.types.counts, minlength=len(vocab))
    bounds = [*used_cutoffs(bilm_config, len(vocab)), len(vocab)]
    tail_shares = [counts[lo:hi].sum() / counts.sum() for lo, hi in zip(bounds, bounds[1:])]

    plans = list(itertools.islice(first_epoch(corpus, training), args.steps + 3))

    group = ProcessGroup(device=torch.device(args.device))
    feeds = {
        "built": lambda build: _built_feed([build(p).to(args.device) for p in plans]),
        "prepared": lambda build: _prepared_feed(plans, build, group),
    }
    rates = matmul_rates(device=args.device)
    print(
        json.dumps(
            {
                "device": args.device,
                "threads": torch.get_num_threads(),
                **{f"matmul_gflops_{k}": round(v / 1e9, 1) for k, v in rates.items()},
            }
        )
    )
    models = [("as configured", bilm_config)]
    if not args.no_full_softmax:
        models.append(("full softmax", replace(bilm_config, softmax="full")))
    for name, config in models:
        flops = 3 * forward_flops_per_token(config, len(vocab), tail_shares)
        speed = {}
        for precision in args.precisions:
            kernels = args.kernels or (
                ("fused", "training") if "cuda" in args.device else ("training",)
            )
            for kernel, feed_name in itertools.product(kernels, args.feeds):
                torch.manual_seed(0)
                bilm = BiLM(config, vocab).to(args.device)
                bilm.precision = precision
                force_kernel(kernel)
                feed = feeds[feed_name](BatchBuilder(corpus, bilm))
                key = "_".join(
                    [precision]
                    + ([kernel] if kernel != kernels[0] else [])
                    + ([feed_name] if feed_name != args.feeds[0] else [])
                )
                run = train_steps(bilm, feed, args.steps, training)
                speed[key] = run["tokens_per_second"]
                gflops = speed[key] * flops / 1e9
                print(
                    json.dumps(
                        {
                            "model": name,
                            "precision": bilm.precision,
                            "lstm_kernel": LSTM_KERNELS[kernel],
                            "feed": FEEDS[feed_name],
                            "vocab": len(vocab),
                            "batch_tokens": training.batch_tokens,
                            **run,
                            "train_mflops_per_token": round(flops / 1e6, 2),
                            "gflops": round(gflops, 1),
                            "share_of_roofline": round(
                                gflops * 1e9 / roofline(rates, precision), 3
                            ),
                        }
                    ),
                    flush=True,
                )
                if args.profile:
                    print_profile(profiled_steps(bilm, feed, args.profile, training))
        for base in ("float32", *(f"float32_{kernel}" for kernel in LSTM_KERNELS)):
            if base in speed:
                ratios = {
                    f"{k}_over_{base}": round(v / speed[base], 2)
                    for k, v in speed.items()
                    if k != base
                }
                print(json.dumps({"model": name, **ratios}))


def print_profile(operators) -> None:
    """The operators by their own time: on the device where there is one
    (the GPU's kernels), else on the CPU."""
    on_device = any(getattr(e, "self_device_time_total", 0) for e in operators)
    key = "self_device_time_total" if on_device else "self_cpu_time_total"
    print(operators.table(sort_by=key, row_limit=25), flush=True)


LSTM_KERNELS = {
    "training": "elmo_spacy (bilm/runtime/recurrence.py)",
    "fused": "torch's nn.LSTM",
    "loop": "the written-out recurrence (bilm/model/lstm.py)",
}
PRECISIONS = ("float32", "bfloat16")  # the default; float16 on request (GPUs without bfloat16)
PHASES = ("forward", "backward", "optimizer")
FEEDS = {
    "built": "batches built beforehand, on the device",
    "prepared": "the prepared corpus, batches built in a thread as pretraining builds them",
}


if __name__ == "__main__":
    main()
