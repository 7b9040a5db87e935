"""The training step captured once per batch shape and replayed (CUDA graphs),
against the step as pretraining runs it, on batches padded to a few shapes.

    python benchmarks/captured_step.py CONFIG CORPUS [--device cuda]
        [--shape-buckets 4] [--batches 20] [--steps 30] [--threads 2]
        [--bilm.lstm_dim 2048 ...: overrides of the config, as `elmo-spacy pretrain` takes them]

Both runs train the same fresh biLM (seed 0, in the config's [training]
precision and the biLM's own kernel choice) on the same --batches batches,
the first of the first epoch's plan, padded to `--shape-buckets` sizes an
octave and kept in page-locked host memory as pretraining keeps them: two
untimed passes over them, then --steps timed steps cycling through them, no
wait for the device between steps. Both use one Adam, fused, and on a GPU
capturable (its step count on the device), and start with one Adam step on
zero gradients, which gives every parameter its state without moving a
weight (a state first made inside a capture would be zeroed at every
replay).

"eager" is pretraining's `training_step`. "captured": the first time a
shape comes, the step runs eagerly on that shape's own buffers (a warm-up:
Triton's kernels compiled, cuBLAS's handles made); the second time it is
captured as one CUDA graph (loss, backward, clipping, Adam), all graphs
sharing one memory pool, then replayed; from then on each batch of that
shape is copied into the buffers and the graph replayed. Without a GPU
nothing is captured: each step runs eagerly on the buffers, which checks
that the batches reach the step through them (the two runs' losses agree).

Prints a JSON line a run: tokens/s of the timed steps (real tokens),
graphs, seconds spent capturing, the timed steps' summed NLL and on a GPU
the peak of allocated memory; then the captured run's speed over the eager
one's and the largest difference between the two runs' weights.
"""

import argparse
import itertools
import json
import tempfile
import time
from dataclasses import fields, replace

import torch
from matmul_rates import float32_without_tf32, synchronize
from pretrain_throughput import first_epoch
from spacy.cli._util import parse_config_overrides

from elmo_spacy.bilm import BiLM, TokenBatch
from elmo_spacy.bilm.inputs.buckets import ShapeBuckets, step_shape
from elmo_spacy.pretrain import load_pretrain_config, open_corpus
from elmo_spacy.pretrain.batches import BatchBuilder, corpus_vocabulary
from elmo_spacy.pretrain.memory import keep_freed_memory
from elmo_spacy.pretrain.train import ShareLoss, training_step


def batch_tensors(batch: TokenBatch) -> list[torch.Tensor]:
    """The batch's tensors, its targets' included, in a fixed order."""
    tensors = []
    for holder in (batch, batch.targets):
        tensors += [getattr(holder, f.name) for f in fields(holder)]
    return [t for t in tensors if isinstance(t, torch.Tensor)]


def copied(batch: TokenBatch, device: torch.device) -> TokenBatch:
    """A batch of new tensors on `device` holding `batch`'s values."""

    def fresh(holder):
        return {
            f.name: getattr(holder, f.name).to(device, copy=True)
            for f in fields(holder)
            if isinstance(getattr(holder, f.name), torch.Tensor)
        }

    return replace(batch, **fresh(batch), targets=replace(batch.targets, **fresh(batch.targets)))


class CapturedSteps:
    """Training steps run through one set of buffers per step shape, and on a
    GPU captured as CUDA graphs (see the module docstring)."""

    def __init__(self, loss: ShareLoss, optimizer, grad_clip: float, device: torch.device):
        self.loss, self.optimizer, self.grad_clip = loss, optimizer, grad_clip
        self.device = device
        self.capture = device.type == "cuda"
        self.parameters = optimizer.param_groups[0]["params"]
        self.shapes: dict[tuple, dict] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.capture_seconds = 0.0

    def run(self, batch: TokenBatch, factors: torch.Tensor) -> torch.Tensor:
        scaled, nll = self.loss.scaled(batch, factors)
        scaled.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, self.grad_clip)
        self.optimizer.step()
        return nll

    def __call__(self, batch: TokenBatch, batch_tokens: int) -> torch.Tensor:
        key = step_shape(batch)
        kept = self.shapes.get(key)
        factors = self.loss.factors(batch_tokens, 1.0, pinned=self.capture)
        if kept is None:
            kept = self.shapes[key] = {
                "batch": copied(batch, self.device),
                "factors": factors.to(self.device, copy=True),
                "graph": None,
                "visits": 0,
            }
        for static, given in zip(batch_tensors(kept["batch"]), batch_tensors(batch)):
            static.copy_(given, non_blocking=self.capture)
        kept["factors"].copy_(factors, non_blocking=self.capture)
        kept["visits"] += 1
        if not self.capture or kept["visits"] == 1:
            self.optimizer.zero_grad()
            return self.run(kept["batch"], kept["factors"]).clone()
        if kept["graph"] is None:
            started = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)  # the graph's backward makes its own
            kept["graph"] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(kept["graph"], pool=self.pool):
                kept["nll"] = self.run(kept["batch"], kept["factors"])
            self.capture_seconds += time.perf_counter() - started
        kept["graph"].replay()
        return kept["nll"].clone()

    @property
    def graphs(self) -> int:
        return sum(kept["graph"] is not None for kept in self.shapes.values())


def adam(bilm: BiLM, learning_rate: float, device: torch.device) -> torch.optim.Adam:
    """Adam, fused, capturable on a GPU, each parameter's state made."""
    optimizer = torch.optim.Adam(
        bilm.parameters(), lr=learning_rate, fused=True, capturable=device.type == "cuda"
    )
    for parameter in bilm.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # zero gradients: the state made, no weight moved
    optimizer.zero_grad()
    return optimizer


def train(name: str, config, training, vocab, batches, steps: int, device) -> tuple[dict, BiLM]:
    torch.manual_seed(0)
    bilm = BiLM(config, vocab).to(device)
    bilm.precision = training.precision
    bilm.train()
    optimizer = adam(bilm, training.learning_rate, device)
    loss = ShareLoss(bilm, world_size=1)
    captured = CapturedSteps(loss, optimizer, training.grad_clip, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    def step(batch: TokenBatch) -> torch.Tensor:
        if name == "captured":
            return captured(batch, batch.targets.n_tokens)
        return training_step(loss, optimizer, training.grad_clip, batch, batch.targets.n_tokens)

    for batch in batches * 2:  # every shape met twice: warmed up, then captured
        step(batch)
    synchronize(device)
    started = time.perf_counter()
    nll = torch.zeros((), device=device)
    tokens = 0
    for batch in itertools.islice(itertools.cycle(batches), steps):
        nll += step(batch)
        tokens += batch.targets.n_tokens
    synchronize(device)
    seconds = time.perf_counter() - started
    figures = {
        "run": name,
        "device": str(device),
        "precision": bilm.precision,
        "batches": len(batches),
        "step_shapes": len({step_shape(b) for b in batches}),
        "tokens_per_second": round(tokens / seconds),
        "graphs": captured.graphs,
        "capture_seconds": round(captured.capture_seconds, 2),
        "nll_sum": float(nll),
    }
    if device.type == "cuda":
        figures["peak_device_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20)
    return figures, bilm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("corpus", help="A prepared corpus, or a text file (prepared first)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N)")
    parser.add_argument("--shape-buckets", type=int, default=4)
    parser.add_argument("--batches", type=int, default=20, help="Distinct batches trained on")
    parser.add_argument("--steps", type=int, default=30, help="Timed steps a run")
    parser.add_argument("--threads", type=int, default=2)
    args, extra = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    float32_without_tf32()
    keep_freed_memory()  # as `elmo-spacy pretrain` runs
    device = torch.device(args.device)
    bilm_config, training = load_pretrain_config(args.config, parse_config_overrides(extra))
    workdir = tempfile.TemporaryDirectory(prefix="captured-step-")
    corpus = open_corpus([args.corpus], workdir.name)
    vocab = corpus_vocabulary(corpus.types, bilm_config.max_vocab_size, bilm_config.min_count)
    buckets = ShapeBuckets(args.shape_buckets, training.batch_tokens)
    plans = first_epoch(corpus, training, buckets)
    build = BatchBuilder(corpus, BiLM(bilm_config, vocab), buckets)
    batches = [build(pieces) for pieces in itertools.islice(plans, args.batches)]
    if device.type == "cuda":
        batches = [batch.pin_memory() for batch in batches]
    runs = {}
    for name in ("eager", "captured"):
        figures, bilm = train(name, bilm_config, training, vocab, batches, args.steps, device)
        print(json.dumps(figures), flush=True)
        runs[name] = figures, bilm
    (eager, eager_bilm), (captured, captured_bilm) = runs["eager"], runs["captured"]
    difference = max(
        float((a - b).detach().abs().max())
        for a, b in zip(eager_bilm.parameters(), captured_bilm.parameters())
    )
    print(
        json.dumps(
            {
                "captured_over_eager": round(
                    captured["tokens_per_second"] / eager["tokens_per_second"], 3
                ),
                "max_weight_difference": difference,
            }
        )
    )


if __name__ == "__main__":
    main()
