"""Tokens/s of `elmo_spacy.allennlp.Elmo` on a user's training path, beside
AllenNLP's computation of the same module, in one run: the forward, and the
forward + backward with the biLM frozen (requires_grad=False, AllenNLP's
default) and fine-tuned (requires_grad=True).

    python benchmarks/allennlp_module.py [--text ../shared/data/ag_news/train.csv]
        [--shapes "original 2x4096_512" "small 2x1024_128"] [--batches 3] [--rounds 2]
        [--states carried zero] [--batch-size 32] [--device cpu] [--profile]

Random weights at the published models' shapes (speed does not depend on
them), batches of --batch-size real sentences of AG News text (32), torch
on two threads (or
a CUDA GPU: --device cuda). Each step is what a user's model does: the
sentences through `batch_to_ids`, one `Elmo(..., num_output_representations=1,
dropout=0.5)` in training mode with gradients on, and for the backward the
mean square of its representation:

- "elmo_spacy": the module as this package ships it, its default state
  ("carried", AllenNLP's) and "zero" (--states);
- "allennlp-style": the computation of AllenNLP's `_ElmoBiLm` as
  benchmarks/elmo_shapes.py writes it (the char CNN over all 50 characters
  of every position, padding tokens included; per layer, direction and time
  step one matmul for the input and one for the state, on the rows not yet
  finished; autograd through it all), then the same `ScalarMix` and dropout,
  from zero states (carrying a state adds nothing to its cost).

The best of --rounds rounds; one JSON line per shape, path and run, then a
summary line per shape with each path's speed-up (elmo_spacy's tokens/s over
allennlp-style's). Where a forward's time is its recurrent products, the
speed-up cannot pass their ratio: "step products" times them alone, one LSTM
layer's steps over --batch-size rows, as each computation runs them
(elmo_spacy: the recurrent and projection products on weights packed once
for oneDNN, the input products of all steps in one GEMM; allennlp-style: an
input, a state and a projection GEMM a step), and prints their ratio.
--profile: then torch.profiler's operators of one more elmo_spacy forward
(zero state), by their own CPU time.
"""

import argparse
import json
import time
from pathlib import Path

import torch
from elmo_shapes import SHAPES, _flip, _lstm_by_step, elmo_config, read_sentences
from matmul_rates import float32_without_tf32, synchronize

from elmo_spacy.allennlp import Elmo, ScalarMix, batch_to_ids, remove_sentence_boundaries
from elmo_spacy.bilm import BiLM, WordVocab

PATHS = ("forward", "frozen forward+backward", "fine-tuned forward+backward")


class AllenNLPStyleElmo(torch.nn.Module):
    """AllenNLP's `Elmo` computed as its code does, on a BiLM's weights."""

    def __init__(self, bilm: BiLM, requires_grad: bool) -> None:
        super().__init__()
        self.bilm = bilm.requires_grad_(requires_grad)
        self.mix = ScalarMix(bilm.config.n_output_layers)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        bilm, config = self.bilm, self.bilm.config
        mask = (ids > 0).any(-1)
        lengths = (mask.sum(-1) + 2).tolist()
        framed = torch.full((len(ids), ids.shape[1] + 2, ids.shape[2]), 0, dtype=torch.int64)
        framed[:, 1:-1] = ids
        for b, n in enumerate(lengths):  # <S> and </S> around each sentence, as AllenNLP adds them
            framed[b, 0] = torch.tensor([259, 257, 260] + [261] * 47)
            framed[b, n - 1] = torch.tensor([259, 258, 260] + [261] * 47)
        framed = (framed - 1).clamp_min(0).to(ids.device)  # bilm-tf's ids (261 rows)
        encoder = bilm.encoder
        embedded = encoder.embed(framed.view(-1, config.max_chars)).transpose(1, 2)
        pooled = [torch.relu(conv(embedded).amax(-1)) for conv in encoder.convs]
        tokens = encoder.projection(encoder.highway(torch.cat(pooled, -1)))
        tokens = tokens.view(len(ids), ids.shape[1] + 2, -1)
        per_direction = []
        for stack, reverse in ((bilm.forward_lstm, False), (bilm.backward_lstm, True)):
            x, outputs = tokens, []
            if reverse:
                x = torch.stack([_flip(x[b], n) for b, n in enumerate(lengths)])
            for i, layer in enumerate(stack.layers):
                y = _lstm_by_step(layer, x, lengths, config.cell_clip, config.proj_clip)
                x = y + x if i > 0 else y
                outputs.append(x)
            if reverse:
                outputs = [
                    torch.stack([_flip(o[b], n) for b, n in enumerate(lengths)]) for o in outputs
                ]
            per_direction.append(outputs)
        framed_mask = (
            torch.arange(ids.shape[1] + 2, device=ids.device)[None]
            < torch.tensor(lengths, device=ids.device)[:, None]
        )
        layers = [torch.cat([tokens, tokens], -1) * framed_mask[..., None]]
        layers += [torch.cat(pair, -1) for pair in zip(*per_direction)]
        mixed = self.mix(layers, framed_mask)
        return self.dropout(remove_sentence_boundaries(mixed, framed_mask)[0])


def step(module, batch, device: str, backward: bool) -> None:
    ids = batch_to_ids(batch).to(device)
    output = module(ids)
    if isinstance(output, dict):
        output = output["elmo_representations"][0]
    if backward:
        output.pow(2).mean().backward()
        module.zero_grad(set_to_none=True)


def step_products(config, rows: int, steps: int, rounds: int) -> dict[str, float]:
    """Seconds of one LSTM layer's products over `steps` steps of `rows`
    rows, as elmo_spacy runs them at inference and as AllenNLP's code does
    (the best of `rounds`)."""
    from elmo_spacy.bilm.runtime.kernels import packed_products

    torch.manual_seed(0)
    layer = torch.nn.LSTM(config.projection_dim, config.lstm_dim, proj_size=config.projection_dim)
    w_ih, w_hh, w_hr = (
        layer.weight_ih_l0.detach(),
        layer.weight_hh_l0.detach(),
        layer.weight_hr_l0.detach(),
    )
    x = torch.randn(steps * rows, config.projection_dim)
    h, hidden = torch.randn(rows, config.projection_dim), torch.randn(rows, config.lstm_dim)
    product = packed_products({})
    recur, project = product(w_hh, "hh"), product(w_hr, "hr")
    t_ih, t_hh, t_hr = w_ih.t().contiguous(), w_hh.t().contiguous(), w_hr.t().contiguous()

    def ours() -> None:
        gates_x = x @ t_ih
        for t in range(steps):
            recur(h, gates_x[t * rows : (t + 1) * rows])
            project(hidden, None)

    def theirs() -> None:
        for t in range(steps):
            torch.addmm(x[t * rows : (t + 1) * rows] @ t_ih, h, t_hh)
            hidden @ t_hr

    best = {"elmo_spacy": float("inf"), "allennlp-style": float("inf")}
    with torch.inference_mode():
        for _ in range(rounds + 1):  # the first round warms up
            for name, run in (("elmo_spacy", ours), ("allennlp-style", theirs)):
                started = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - started)
    return best


def timed(module, batches, device: str, backward: bool) -> float:
    synchronize(device)
    started = time.perf_counter()
    for batch in batches:
        step(module, batch, device, backward)
    synchronize(device)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_text = Path(__file__).parent.parent.parent / "shared/data/ag_news/train.csv"
    parser.add_argument("--text", type=Path, default=default_text, help="AG News CSV")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batches", type=int, default=3, help="timed batches per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--states", nargs="*", default=["carried", "zero"])
    parser.add_argument("--paths", nargs="*", default=list(PATHS), choices=PATHS)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences a batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N)")
    parser.add_argument("--profile", action="store_true", help="then profile one forward")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    float32_without_tf32()
    size = args.batch_size
    sentences = read_sentences(args.text, size * (args.batches + 1))
    batches = [sentences[i : i + size] for i in range(0, len(sentences), size)]
    warm_up, timed_batches = batches[0], batches[1 : args.batches + 1]
    tokens = sum(len(s) for batch in timed_batches for s in batch)
    for shape in args.shapes:
        config = elmo_config(**SHAPES[shape])

        def make(config=config) -> BiLM:
            torch.manual_seed(0)
            return BiLM(config, WordVocab.specials_only(), with_softmax=False).to(args.device)

        runs = [("allennlp-style", None)] + [("elmo_spacy", state) for state in args.states]
        best: dict[tuple[str, str | None, str], float] = {}
        for _ in range(args.rounds):
            for path in args.paths:
                fine_tuned, backward = path.startswith("fine-tuned"), path != "forward"
                for name, state in runs:
                    if name == "allennlp-style":
                        module = AllenNLPStyleElmo(make(), fine_tuned).to(args.device)
                    else:
                        module = Elmo(make(), None, 1, requires_grad=fine_tuned, state=state)
                    module.train()
                    step(module, warm_up, args.device, backward)
                    seconds = timed(module, timed_batches, args.device, backward)
                    key = (name, state, path)
                    best[key] = min(best.get(key, float("inf")), seconds)
        summary = {"shape": shape, "device": args.device, "tokens": tokens, "batch_size": size}
        summary["speedup"] = {}
        for (name, state, path), seconds in best.items():
            run = name if state is None else f"{name} ({state} state)"
            line = {"shape": shape, "path": path, "run": run, "tokens/s": round(tokens / seconds)}
            print(json.dumps(line), flush=True)
            if name == "elmo_spacy":
                reference = best[("allennlp-style", None, path)]
                summary["speedup"][f"{path}, {state} state"] = round(reference / seconds, 2)
        if args.device == "cpu":
            steps = max(len(s) for batch in timed_batches for s in batch) + 2
            products = step_products(config, size, steps, args.rounds)
            line = {"shape": shape, "path": "step products", "rows": size, "steps": steps}
            line["seconds"] = {k: round(v, 4) for k, v in products.items()}
            print(json.dumps(line), flush=True)
            summary["speedup"]["step products"] = round(
                products["allennlp-style"] / products["elmo_spacy"], 2
            )
        print(json.dumps(summary), flush=True)
        if args.profile:
            from torch.profiler import profile

            module = Elmo(make(), None, 1, state="zero").train()
            step(module, warm_up, args.device, False)
            with profile() as profiled:
                step(module, timed_batches[0], args.device, False)
            print(profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main()
