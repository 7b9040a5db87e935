"""Tokens/s of the biLM forward at the published ELMo models' shapes, beside the
same model on torch's unclipped fused LSTM, a reference-style forward, and the
machine's matmul rate measured in the same run.

    python benchmarks/elmo_shapes.py [--text ../shared/data/ag_news/train.csv] [--batches 10]

Random weights (speed does not depend on them), torch on two threads, batches of
32 real sentences of AG News text (spaCy's tokenizer and sentencizer, in file
order), run under torch.inference_mode as the `elmo` pipe runs them:

- "clipped": the biLM as this package runs it: bilm-tf's architecture (cell and
  projection clipped at 3), the LSTM recurrence on oneDNN-packed weights, the
  type cache on (it warms up over the run, as in a pipe);
- "fused": the same model and cache on torch's fused nn.LSTM over packed
  sequences, without clipping;
- "reference-style": written here as AllenNLP's `_ElmoBiLm` computes ELMo: the
  char CNN over all 50 characters of every token position, padding tokens
  included, no cache; then per layer, direction and time step one matmul for
  the input and one for the state (all gates at once), on the rows of the
  sentences not yet finished.

Model FLOPs count every matmul and convolution of that reference computation
(padding tokens excluded), 2 per multiply-add; the roofline is those FLOPs at
the rate of a 2048 x 2048 x 2048 matmul measured in the same run (the best of
three rounds). Prints one
JSON line per shape and forward, then a summary line per shape.
"""

import argparse
import csv
import json
import time
from pathlib import Path

import spacy
import torch

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab

FILTERS = [(1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)]
SHAPES = {
    "original 2x4096_512": {"lstm_dim": 4096, "projection_dim": 512, "n_highway": 2},
    "small 2x1024_128": {"lstm_dim": 1024, "projection_dim": 128, "n_highway": 1},
}
BATCH = 32


def elmo_config(lstm_dim: int, projection_dim: int, n_highway: int) -> BiLMConfig:
    return BiLMConfig(
        encoder="char_cnn",
        char_ids="bilm_tf",
        max_chars=50,
        char_dim=16,
        filters=FILTERS,
        n_highway=n_highway,
        projection_dim=projection_dim,
        lstm_dim=lstm_dim,
        n_layers=2,
        cell_clip=3.0,
        proj_clip=3.0,
        forget_bias=1.0,
        dropout=0.0,
    )


def read_sentences(path: Path, n: int) -> list[list[str]]:
    """The first n sentences of AG News texts (title and description of each row)."""
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    sentences: list[list[str]] = []
    with path.open(encoding="utf-8") as lines:
        texts = (" ".join(row[1:]).replace("\\", " ") for row in csv.reader(lines))
        for doc in nlp.pipe(texts, batch_size=256):
            sentences += [[t.text for t in s if not t.is_space] for s in doc.sents]
            if len(sentences) >= n:
                break
    return [s for s in sentences if s][:n]


def model_flops(config: BiLMConfig, batch: list[list[str]]) -> float:
    """FLOPs of the reference computation for a batch (real positions only)."""
    positions = sum(len(s) + 2 for s in batch)
    chars, n_filters = config.max_chars, sum(n for _, n in config.filters)
    conv = sum(w * config.char_dim * n * (chars - w + 1) for w, n in config.filters)
    highway = config.n_highway * n_filters * 2 * n_filters
    projection = n_filters * config.projection_dim
    p, h = config.projection_dim, config.lstm_dim
    lstm = 2 * config.n_layers * (p * 4 * h + p * 4 * h + h * p)
    return 2.0 * positions * (conv + highway + projection + lstm)


def timed(run, batches) -> float:
    started = time.perf_counter()
    for batch in batches:
        run(batch)
    return time.perf_counter() - started


def matmul_rate(size: int = 2048, repeats: int = 10, rounds: int = 3) -> float:
    """FLOP/s of a size^3 matmul: the best of `rounds` rounds (the peak)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * size**3 * repeats / (time.perf_counter() - started))
    return best


class ReferenceStyle:
    """ELMo as AllenNLP's _ElmoBiLm computes it, on the weights of a BiLM."""

    def __init__(self, bilm: BiLM) -> None:
        self.bilm = bilm
        self.config = bilm.config

    def __call__(self, batch: list[list[str]]) -> torch.Tensor:
        bilm, config = self.bilm, self.config
        chars = bilm.chars
        width = max(len(s) for s in batch) + 2
        ids = torch.full((len(batch), width, config.max_chars), chars.padding, dtype=torch.int64)
        for b, sentence in enumerate(batch):
            rows = [chars.boundary_ids(chars.begin_of_sentence)]
            rows += [chars.token_ids(t) for t in sentence]
            rows.append(chars.boundary_ids(chars.end_of_sentence))
            for t, row in enumerate(rows):
                ids[b, t, : len(row)] = torch.from_numpy(row)
        encoder = bilm.encoder
        embedded = encoder.embed(ids.view(-1, config.max_chars)).transpose(1, 2)
        pooled = [torch.relu(conv(embedded).amax(-1)) for conv in encoder.convs]
        tokens = encoder.projection(encoder.highway(torch.cat(pooled, -1)))
        tokens = tokens.view(len(batch), width, -1)
        lengths = [len(s) + 2 for s in batch]
        outputs = []
        for stack, reverse in ((bilm.forward_lstm, False), (bilm.backward_lstm, True)):
            x = tokens
            if reverse:
                x = torch.stack([_flip(x[b], n) for b, n in enumerate(lengths)])
            for i, layer in enumerate(stack.layers):
                y = _lstm_by_step(layer, x, lengths, config.cell_clip, config.proj_clip)
                x = y + x if i > 0 else y
            if reverse:
                x = torch.stack([_flip(x[b], n) for b, n in enumerate(lengths)])
            outputs.append(x)
        return torch.cat(outputs, -1)


def _flip(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([x[:n].flip(0), x[n:]])


def _lstm_by_step(layer, x, lengths, cell_clip, proj_clip) -> torch.Tensor:
    """AllenNLP's LstmCellWithProjection: rows sorted by length, one input and one
    state matmul per step, on the rows still running."""
    order = sorted(range(len(lengths)), key=lambda b: -lengths[b])
    x = x[order]
    lengths = [lengths[b] for b in order]
    hidden = layer.hidden_size
    w_in, w_state = layer.weight_ih_l0.t(), layer.weight_hh_l0.t()
    bias, w_proj = layer.bias_ih_l0 + layer.bias_hh_l0, layer.weight_hr_l0.t()
    h = x.new_zeros(len(order), layer.proj_size)
    c = x.new_zeros(len(order), hidden)
    out = x.new_zeros(len(order), x.shape[1], layer.proj_size)
    for t in range(x.shape[1]):
        active = sum(n > t for n in lengths)
        gates = x[:active, t] @ w_in + torch.addmm(bias, h[:active], w_state)
        i, f, g, o = gates.chunk(4, 1)
        cell = torch.sigmoid(f) * c[:active] + torch.sigmoid(i) * torch.tanh(g)
        cell = cell.clamp(-cell_clip, cell_clip)
        state = (torch.sigmoid(o) * torch.tanh(cell)) @ w_proj
        state = state.clamp(-proj_clip, proj_clip)
        c, h = c.clone(), h.clone()
        c[:active], h[:active] = cell, state
        out[:active, t] = state
    return out[torch.argsort(torch.tensor(order))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_text = Path(__file__).parent.parent.parent / "shared/data/ag_news/train.csv"
    parser.add_argument("--text", type=Path, default=default_text, help="AG News CSV")
    parser.add_argument("--batches", type=int, default=10, help="timed batches per forward")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    sentences = read_sentences(args.text, BATCH * (args.batches + 1))
    batches = [sentences[i : i + BATCH] for i in range(0, len(sentences), BATCH)]
    warm_up, timed_batches = batches[0], batches[1 : args.batches + 1]
    tokens = sum(len(s) for batch in timed_batches for s in batch)
    forwards = ("clipped", "fused", "reference-style")
    for shape in args.shapes:
        config = elmo_config(**SHAPES[shape])
        flops = sum(model_flops(config, batch) for batch in timed_batches)
        seconds = {name: float("inf") for name in forwards}
        peak = 0.0
        for _ in range(args.rounds):
            peak = max(peak, matmul_rate())
            for name in forwards:
                torch.manual_seed(0)
                bilm = BiLM(config, WordVocab.specials_only(), with_softmax=False).eval()
                if name == "fused":
                    bilm.forward_lstm.kernel = bilm.backward_lstm.kernel = "fused"
                run = ReferenceStyle(bilm) if name == "reference-style" else bilm_forward(bilm)
                with torch.inference_mode():
                    run(warm_up)
                    seconds[name] = min(seconds[name], timed(run, timed_batches))
        results = {name: tokens / seconds[name] for name in forwards}
        for name in forwards:
            line = {"shape": shape, "forward": name, "tokens": tokens, "seconds": seconds[name]}
            line["tokens_per_second"] = results[name]
            line["share_of_roofline"] = flops / seconds[name] / peak
            print(json.dumps(line), flush=True)
        summary = {
            "shape": shape,
            "matmul_gflops": peak / 1e9,
            "model_mflop_per_token": flops / tokens / 1e6,
            "roofline_tokens_per_second": peak / (flops / tokens),
            "clipped_over_fused": results["clipped"] / results["fused"],
            "clipped_over_reference_style": results["clipped"] / results["reference-style"],
            "clipped_share_of_roofline": results["clipped"] / (peak / (flops / tokens)),
        }
        print(json.dumps(summary), flush=True)


def bilm_forward(bilm: BiLM):
    return lambda batch: bilm(bilm.batch(batch))


if __name__ == "__main__":
    main()
