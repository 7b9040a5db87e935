"""Tokens/s of the biLM forward at the published ELMo models' shapes, in float32
and bfloat16, beside the same model on torch's unclipped fused LSTM, a
reference-style forward, and the machine's matmul rates measured in the same
run; and how far bfloat16 moves each layer from float32.

    python benchmarks/elmo_shapes.py [--text ../shared/data/ag_news/train.csv] [--batches 10]
        [--precisions float32 bfloat16] [--forwards clipped embedder fused reference-style]
        [--bilm PATH] [--batch-tokens 4096] [--device cpu] [--int8-lstm]
        [--type-cache-size N] [--profile]

Random weights (speed does not depend on them), torch on two threads (or a
CUDA GPU: --device cuda, TF32 off, the clock read after the GPU's queue is
done), batches of 32 real sentences of AG News text (spaCy's tokenizer and
sentencizer, in file order), run under torch.inference_mode as the `elmo`
pipe runs them:

- "clipped": the biLM as this package runs it: bilm-tf's architecture (cell and
  projection clipped at 3), the LSTM recurrence on oneDNN-packed weights, the
  type cache on (it warms up over the run, as in a pipe); once per precision
  ("clipped" in float32, "clipped-bfloat16": `BiLM.precision = "bfloat16"`,
  bfloat16 weights packed once, cell state in float32). On a GPU, no type
  cache, and the recurrence runs step by step (cuDNN cannot clip);
- "fused": the same model and cache on torch's fused nn.LSTM over packed
  sequences, without clipping (cuDNN on a GPU): the LSTM kernel forced
  (`on_fused_lstm`);
- "embedder" (once per precision, as "clipped"): the same biLM as the `elmo`
  pipe, `embed` and `Embedder` run it, on all the timed sentences at once:
  sorted by length, in batches of at most --batch-tokens padded tokens (4,096,
  their default), up to the float32 arrays handed back. Its batches hold more
  rows than 32, so each step's weights serve more arithmetic;
- "embedder-int8_lstm" (with --int8-lstm): "embedder" with the LSTM's
  products in int8 (torch's dynamic quantization, weights per output
  channel, as benchmarks/step_gemm_rates.py times them), the rest float32:
  what an int8 precision would give. The package has none (README,
  "Precision"); no share of a roofline is given for it;
- "reference-style": written here as AllenNLP's `_ElmoBiLm` computes ELMo: the
  char CNN over all 50 characters of every token position, padding tokens
  included, no cache; then per layer, direction and time step one matmul for
  the input and one for the state (all gates at once), on the rows of the
  sentences not yet finished.

Model FLOPs count every matmul and convolution of that reference computation
(padding tokens excluded), 2 per multiply-add; the roofline of a forward is
those FLOPs at the rate of a 2048 x 2048 x 2048 matmul in its own precision
through oneDNN, measured in the same run (the best of three rounds; see
benchmarks/matmul_rates.py; MKL's float32 rate is printed for reference).

The layers' distance (bfloat16 against float32, over the real positions of
the timed batches): per layer the max and mean absolute difference, the max
over the layer's largest absolute value, and the mean cosine of a position's
vectors. With random weights (the default) the LSTM layers are small; --bilm
PATH runs a trained biLM (a directory of `elmo-spacy pretrain` or
`convert-elmo`, or a bilm-tf folder) instead of the shapes, for distances on
real weights. Prints one JSON line per shape and forward, one per shape with
the distances, then a summary line per shape. --type-cache-size sets the
biLM's (0: no type cache); --profile then prints torch.profiler's operators
over one more timed run of the first forward (by their own CPU time, and on
a GPU by their own GPU time).
"""

import argparse
import contextlib
import copy
import csv
import json
import time
from pathlib import Path

import spacy
import torch
from kernel_choice import force_kernel
from matmul_rates import float32_without_tf32, matmul_rates, roofline, synchronize
from step_gemm_rates import int8_lstm_products

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab, load_bilm
from elmo_spacy.bilm.runner import Runner, RunSettings

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
    if config.encoder == "word":  # a table lookup and a projection
        conv, highway, projection = 0, 0, config.word_dim * config.projection_dim
    p, h = config.projection_dim, config.lstm_dim
    lstm = 2 * config.n_layers * (p * 4 * h + p * 4 * h + h * p)
    return 2.0 * positions * (conv + highway + projection + lstm)


def timed(run, batches, device: str) -> float:
    synchronize(device)
    started = time.perf_counter()
    for batch in batches:
        run(batch)
    synchronize(device)
    return time.perf_counter() - started


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
        ids = ids.to(encoder.embed.weight.device)
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
    return out[torch.argsort(torch.tensor(order, device=out.device))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_text = Path(__file__).parent.parent.parent / "shared/data/ag_news/train.csv"
    parser.add_argument("--text", type=Path, default=default_text, help="AG News CSV")
    parser.add_argument("--batches", type=int, default=10, help="timed batches per forward")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument("--bilm", type=Path, help="a trained biLM to run instead of the shapes")
    parser.add_argument("--precisions", nargs="*", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--forwards", nargs="*", default=list(FORWARDS), choices=FORWARDS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-tokens", type=int, default=4096, help="the embedder's batches")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N)")
    parser.add_argument("--int8-lstm", action="store_true", help="Also: embedder-int8_lstm")
    parser.add_argument("--type-cache-size", type=int, help="the biLM's (default: its own)")
    parser.add_argument("--profile", action="store_true", help="then profile the first forward")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    float32_without_tf32()
    sentences = read_sentences(args.text, BATCH * (args.batches + 1))
    batches = [sentences[i : i + BATCH] for i in range(0, len(sentences), BATCH)]
    warm_up, timed_batches = batches[0], batches[1 : args.batches + 1]
    timed_sentences = [s for batch in timed_batches for s in batch]
    tokens = sum(len(s) for s in timed_sentences)
    runs = [
        name if precision == "float32" else f"{name}-{precision}"
        for name in args.forwards
        if name in BY_PRECISION
        for precision in args.precisions
    ]
    if args.int8_lstm and "embedder" in args.forwards:
        runs.append(INT8_RUN)
    runs += [name for name in args.forwards if name not in BY_PRECISION]
    shapes = [str(args.bilm)] if args.bilm else args.shapes
    for shape in shapes:
        if args.bilm:
            loaded = load_bilm(args.bilm, with_softmax=False)

            def make(loaded=loaded) -> BiLM:
                return copy.deepcopy(loaded).to(args.device)

        else:
            config = elmo_config(**SHAPES[shape])

            def make(config=config) -> BiLM:
                torch.manual_seed(0)
                bilm = BiLM(config, WordVocab.specials_only(), with_softmax=False)
                return bilm.eval().to(args.device)

        config = make().config
        flops = sum(model_flops(config, batch) for batch in timed_batches)
        seconds = {name: float("inf") for name in runs}
        rates: dict[str, float] = {}
        for round_ in range(args.rounds):
            for kernel, rate in matmul_rates(device=args.device).items():
                rates[kernel] = max(rates.get(kernel, 0.0), rate)
            for name in runs:
                bilm = make()
                if args.type_cache_size is not None:
                    bilm.type_cache_size = args.type_cache_size
                bilm.precision = "float32" if name == INT8_RUN else precision_of(name)
                int8 = int8_lstm_products() if name == INT8_RUN else contextlib.nullcontext()
                fused = on_fused_lstm() if name == "fused" else contextlib.nullcontext()
                with int8, fused, torch.inference_mode():
                    if name.startswith("embedder"):
                        settings = RunSettings(
                            precision=bilm.precision, max_batch_tokens=args.batch_tokens
                        )

                        def run(batch, runner=Runner(bilm, settings)) -> None:
                            runner.embed(batch)

                        run(timed_sentences)  # the warm-up: the same batch shapes as timed
                        elapsed = timed(run, [timed_sentences], args.device)
                        seconds[name] = min(seconds[name], elapsed)
                        continue
                    run = ReferenceStyle(bilm) if name == "reference-style" else bilm_forward(bilm)
                    run(warm_up)
                    seconds[name] = min(seconds[name], timed(run, timed_batches, args.device))
                    if args.profile and name == runs[0] and round_ == args.rounds - 1:
                        bilm.inference_cache().types.clear()
                        profile_run(run, timed_batches, args.device)
        results = {name: tokens / seconds[name] for name in runs}
        for name in runs:
            line = {"shape": shape, "forward": name, "tokens": tokens, "seconds": seconds[name]}
            line["tokens_per_second"] = results[name]
            if name != INT8_RUN:
                line["share_of_roofline"] = (
                    flops / seconds[name] / roofline(rates, precision_of(name))
                )
            print(json.dumps(line), flush=True)
        summary = {
            "shape": shape,
            "device": torch.cuda.get_device_name(args.device) if "cuda" in args.device else "cpu",
            "threads": args.threads,
            **{f"matmul_gflops_{kernel}": rate / 1e9 for kernel, rate in rates.items()},
            "model_mflop_per_token": flops / tokens / 1e6,
        }
        for name in runs:
            stem = name.partition("-")[0]
            if stem in BY_PRECISION and name != INT8_RUN:
                peak = roofline(rates, precision_of(name)) / (flops / tokens)
                summary[f"{name}_share_of_roofline"] = results[name] / peak
            # a precision's run against float32's of the same forward, the others against "clipped"
            base = stem if stem in BY_PRECISION else "clipped"
            if name != base and base in results:
                summary[f"{name}_over_{base}"] = results[name] / results[base]
        if len(args.precisions) > 1 and "float32" in args.precisions:
            distances = layer_distances(make, timed_batches, args.precisions)
            print(json.dumps({"shape": shape, **distances}), flush=True)
        print(json.dumps(summary), flush=True)


PRECISIONS = ("float32", "bfloat16")
FORWARDS = ("clipped", "embedder", "fused", "reference-style")
BY_PRECISION = ("clipped", "embedder")  # run once per precision
INT8_RUN = "embedder-int8_lstm"


def precision_of(name: str) -> str:
    """The precision of a forward's name ("clipped-bfloat16": bfloat16)."""
    base, _, precision = name.partition("-")
    return precision if base in BY_PRECISION and precision else "float32"


def layer_distances(make, batches: list[list[list[str]]], precisions) -> dict:
    """How far each reduced precision moves each layer from float32, over the
    real positions of `batches`: max and mean |difference|, the max over the
    layer's largest |value| (float32), and the mean cosine per position."""
    outputs = {}
    for precision in precisions:
        bilm = make()
        bilm.precision = precision
        with torch.inference_mode():
            outputs[precision] = [real_positions(bilm(bilm.batch(b)), b) for b in batches]
    reference = torch.cat(outputs["float32"], dim=1)  # (L + 1, N, 2P)
    distances = {}
    for precision in precisions:
        if precision == "float32":
            continue
        low = torch.cat(outputs[precision], dim=1)
        difference = (low - reference).abs()
        cosine = torch.nn.functional.cosine_similarity(low, reference, dim=-1)
        distances[precision] = [
            {
                "layer": i,
                "max_abs_diff": float(difference[i].max()),
                "mean_abs_diff": float(difference[i].mean()),
                "max_diff_over_max_abs": float(difference[i].max() / reference[i].abs().max()),
                "mean_abs_value": float(reference[i].abs().mean()),
                "mean_cosine": float(cosine[i].mean()),
                "min_cosine": float(cosine[i].min()),
            }
            for i in range(len(reference))
        ]
    return distances


def real_positions(layers: torch.Tensor, batch: list[list[str]]) -> torch.Tensor:
    """(L + 1, B, T, D) -> (L + 1, N, D): the positions of real tokens."""
    real = torch.zeros(layers.shape[1:3], dtype=torch.bool, device=layers.device)
    for i, sentence in enumerate(batch):
        real[i, : len(sentence)] = True
    return layers[:, real]


def profile_run(run, batches, device: str) -> None:
    """Print torch.profiler's operators over `run` of each batch."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if "cuda" in device:
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiled:
        timed(run, batches, device)
    table = profiled.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=30), flush=True)
    if "cuda" in device:
        print(table.table(sort_by="self_device_time_total", row_limit=30), flush=True)


@contextlib.contextmanager
def on_fused_lstm():
    """Every biLM's LSTM stacks on torch's fused nn.LSTM inside the block,
    the clips ignored: the package's own choice (`choose_kernel`) replaced."""
    force_kernel("fused")
    try:
        yield
    finally:
        force_kernel(None)


def bilm_forward(bilm: BiLM):
    return lambda batch: bilm(bilm.batch(batch))


if __name__ == "__main__":
    main()
