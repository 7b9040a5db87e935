"""onnxruntime running an exported biLM against `Embedder`, on the same
sentences, one run, side by side (CPU); or, with --latency, the time of one
sentence at a time.

    python benchmarks/serving.py [--bilm PATH | --shape small] [--text FILE] [--sentences N]
        [--int8] [--threads N] [--latency [--calls 1000] [--tokens 20]]

The biLM: PATH (anything `load_bilm` reads), or one of random weights of a
shape of benchmarks/elmo_shapes.py ("small" 2x1024_128, "original"
2x4096_512). Sentences: the first lines of FILE (default: the plugin's
sample text, repeated), tokenised on white space. onnxruntime runs the
session `session_options` recommends, on --threads threads (default torch's,
as `Embedder` runs).

Throughput (the default): both sides run batches of the same sentences,
sorted by length and cut at --batch-tokens padded tokens, after a warm-up on
the first 10% of the sentences (not timed); tokens/s counts real tokens,
and the ONNX side's time includes making its inputs from the tokens. A
second `Embedder` side runs without its type cache (each batch's distinct
tokens encoded again, as the stateless graph encodes them). Prints one JSON
line per side, then the ratios; --profile, then the float32 model's time by
operator (onnxruntime's profiler; a scan's own time includes the operators
it runs, which are also counted under their own names). --int8 adds the model exported with
--quantize int8 as a side, and a line per layer with how far its layers are
from the float32 model's (max and mean absolute difference over the real
positions, and the layer's largest absolute value).

--latency: one sentence of --tokens tokens (the first line of FILE with as
many, by spaCy's English tokenizer), --calls calls one after the other after
20 untimed ones, each side on its own: `Embedder.embed([tokens])`, the
`elmo` pipe in `nlp(text)` (a blank English pipeline, tokenizer included)
and onnxruntime in float32 and int8 (inputs made from the tokens in each
call). `Embedder` and the pipe keep the sentence's token encodings in their
type cache after the first call, as a server repeating words would; the ONNX
model encodes them in every call. Prints one JSON line per side with the
median (p50) and 99th percentile (p99) in milliseconds.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy
import onnxruntime
import spacy
import torch
from elmo_shapes import SHAPES, elmo_config

from elmo_spacy.bilm import BiLM, WordVocab, load_bilm
from elmo_spacy.bilm.formats.directory import save_bilm
from elmo_spacy.bilm.formats.exported import (
    ONNX_FILE,
    export_bilm,
    serving_inputs,
    session_options,
)
from elmo_spacy.bilm.inputs.batch import length_runs
from elmo_spacy.embedder import Embedder

SHAPE_NAMES = {name.split()[0]: name for name in SHAPES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bilm", type=Path, help="A biLM (default: random weights, --shape)")
    parser.add_argument("--shape", choices=sorted(SHAPE_NAMES), default="small")
    parser.add_argument("--text", type=Path, help="Sentences, one a line")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--int8", action="store_true", help="Also the int8 model")
    parser.add_argument("--threads", type=int, help="onnxruntime's threads (default torch's)")
    parser.add_argument("--latency", action="store_true", help="One sentence at a time")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument(
        "--profile", action="store_true", help="Where the float32 model's time goes, by operator"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.bilm is not None:
        bilm, name = load_bilm(args.bilm, with_softmax=False), str(args.bilm)
    else:
        config = elmo_config(**SHAPES[SHAPE_NAMES[args.shape]])
        bilm, name = BiLM(config, WordVocab.specials_only(), with_softmax=False), args.shape
    threads = args.threads or torch.get_num_threads()
    with tempfile.TemporaryDirectory() as folder:
        float32 = export_session(bilm, Path(folder) / "float32", threads, args.profile)
        sessions = {"onnxruntime": float32}
        if args.int8 or args.latency:
            sessions["onnxruntime-int8"] = export_session(bilm, Path(folder) / "int8", threads)
        if args.latency:
            bilm_path = args.bilm or save_bilm(bilm, Path(folder) / "bilm")
            latency(bilm, bilm_path, sessions, args, name)
        else:
            throughput(bilm, sessions, args, name, threads)


def export_session(
    bilm: BiLM, folder: Path, threads: int, profile: bool = False
) -> onnxruntime.InferenceSession:
    """An onnxruntime session of `bilm` exported to `folder` (int8 where the
    folder is named so), with onnxruntime's profiler on where `profile`."""
    folder.mkdir()
    quantize = "int8" if folder.name == "int8" else None
    export_bilm(bilm, folder, formats=["onnx"], quantize=quantize)
    options = session_options(threads)
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(folder / "profile")
    return onnxruntime.InferenceSession(
        str(folder / ONNX_FILE), options, providers=["CPUExecutionProvider"]
    )


def print_profile(session: onnxruntime.InferenceSession) -> None:
    """The time of each operator type in the session's profile (warm-up and
    timed run together), the scans' own apart from the operators they run,
    one JSON line each, the largest first."""
    events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            name = event["args"].get("op_name", "?")
            times[name] = times.get(name, 0.0) + event["dur"] / 1e3
    total = sum(times.values())
    for name, ms in sorted(times.items(), key=lambda item: -item[1]):
        print(json.dumps({"profile": name, "ms": round(ms, 1), "share": round(ms / total, 3)}))


def throughput(bilm: BiLM, sessions: dict, args, name: str, threads: int) -> None:
    sentences = read_sentences(args.text, args.sentences)
    warm, timed = sentences[: len(sentences) // 10], sentences[len(sentences) // 10 :]
    n_tokens = sum(len(s) for s in timed)
    embedder = Embedder(bilm, max_batch_tokens=args.batch_tokens)

    def without_type_cache(batch: list[list[str]]) -> list:
        """`Embedder` encoding each batch's types again, as the stateless graph does."""
        kept, bilm.type_cache_size = bilm.type_cache_size, 0
        try:
            return embedder.embed(batch)
        finally:
            bilm.type_cache_size = kept

    runs = {"embedder": embedder.embed, "embedder, no type cache": without_type_cache}
    for side, session in sessions.items():
        runs[side] = lambda batch, s=session: run_onnx(s, bilm, batch, args.batch_tokens)
    results, layers = {}, {}
    for side, run in runs.items():
        run(warm)
        started = time.perf_counter()
        layers[side] = run(timed)
        seconds = time.perf_counter() - started
        results[side] = n_tokens / seconds
        line = {"side": side, "biLM": name, "sentences": len(timed), "tokens": n_tokens}
        line.update(seconds=round(seconds, 2), tokens_per_second=round(n_tokens / seconds))
        print(json.dumps(line), flush=True)
    if args.profile:
        print_profile(sessions["onnxruntime"])
    if "onnxruntime-int8" in layers:
        for layer, gaps in enumerate(distances(layers["onnxruntime-int8"], layers["onnxruntime"])):
            print(json.dumps({"int8_against_float32": f"layer {layer}", **gaps}), flush=True)
    for side in sessions:
        ratio = results[side] / results["embedder"]
        uncached = results[side] / results["embedder, no type cache"]
        print(
            f"{side} / Embedder: {ratio:.2f}x the tokens/s, / Embedder without its type "
            f"cache: {uncached:.2f}x ({threads} threads)"
        )


def run_onnx(session, bilm: BiLM, sentences: list[list[str]], batch_tokens: int) -> list:
    """The layers of each sentence (in length order), batched as Embedder batches."""
    order = numpy.argsort([len(s) for s in sentences], kind="stable")
    bounds = length_runs(numpy.array([len(sentences[i]) for i in order]), batch_tokens)
    outputs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        batch = [sentences[i] for i in order[a:b]]
        (layers,) = session.run(None, serving_inputs(bilm, batch))
        outputs.extend(layers[:, j, : len(s)] for j, s in enumerate(batch))
    return outputs


def distances(ours: list[numpy.ndarray], theirs: list[numpy.ndarray]) -> list[dict]:
    """Per layer, over every sentence's (L + 1, n, D) layers: the max and
    mean absolute difference and the largest absolute value of `theirs`."""
    gaps = []
    for layer in range(theirs[0].shape[0]):
        gap = numpy.concatenate(
            [numpy.abs(a[layer] - b[layer]).ravel() for a, b in zip(ours, theirs)]
        )
        largest = max(float(numpy.abs(b[layer]).max()) for b in theirs)
        gaps.append({"max": float(gap.max()), "mean": float(gap.mean()), "largest": largest})
    return gaps


def latency(bilm: BiLM, bilm_path: Path, sessions: dict, args, name: str) -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo").initialize(lambda: [], bilm_path=str(bilm_path))
    text = first_sentence(nlp, args.text, args.tokens)
    tokens = [t.text for t in nlp.make_doc(text)]
    embedder = Embedder(bilm)
    sides = {
        "embedder": lambda: embedder.embed([tokens]),
        "pipe nlp(text)": lambda: nlp(text)._.elmo,
    }
    for side, session in sessions.items():
        sides[side] = lambda s=session: s.run(None, serving_inputs(bilm, [tokens]))
    for side, call in sides.items():
        for _ in range(20):
            call()
        times = []
        for _ in range(args.calls):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        p50, p99 = numpy.percentile(numpy.array(times) * 1e3, [50, 99])
        line = {"mode": "latency", "side": side, "biLM": name, "tokens": len(tokens)}
        line.update(calls=args.calls, p50_ms=round(float(p50), 2), p99_ms=round(float(p99), 2))
        print(json.dumps(line), flush=True)


def first_sentence(nlp, path: Path | None, n_tokens: int) -> str:
    """The first `n_tokens` tokens (spaCy's) of the first line with as many, as text."""
    for line in read_lines(path):
        doc = nlp.make_doc(line)
        if len(doc) >= n_tokens:
            text = doc[:n_tokens].text
            if len(nlp.make_doc(text)) == n_tokens:
                return text
    raise SystemExit(
        f"No line of {path or 'the sample text'} has {n_tokens} tokens: ask fewer (--tokens) or give --text"
    )


def read_lines(path: Path | None) -> list[str]:
    if path is None:
        path = Path(spacy.util.get_package_path("elmo_spacy")) / "data" / "sample.txt"
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.split()]


def read_sentences(path: Path | None, n: int) -> list[list[str]]:
    lines = [line.split() for line in read_lines(path)]
    return [lines[i % len(lines)] for i in range(n)]


if __name__ == "__main__":
    main()
