"""onnxruntime running an exported biLM against `Embedder`, on the same
sentences, one run, side by side (CPU).

    python benchmarks/serving.py [--bilm PATH | --shape small] [--text FILE] [--sentences N]

The biLM: PATH (anything `load_bilm` reads), or one of random weights of a
shape of benchmarks/elmo_shapes.py ("small" 2x1024_128, "original"
2x4096_512). Sentences: the first lines of FILE (default: the plugin's
sample text, repeated), tokenised on white space. Both sides run batches of
the same sentences, sorted by length and cut at --batch-tokens padded tokens,
after a warm-up on the first 10% of the sentences (not timed); tokens/s
counts real tokens. Prints one JSON line per side, then the ratio.
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
from elmo_spacy.bilm.formats.exported import ONNX_FILE, export_bilm, serving_inputs
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
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.bilm is not None:
        bilm, name = load_bilm(args.bilm, with_softmax=False), str(args.bilm)
    else:
        config = elmo_config(**SHAPES[SHAPE_NAMES[args.shape]])
        bilm, name = BiLM(config, WordVocab.specials_only(), with_softmax=False), args.shape
    sentences = read_sentences(args.text, args.sentences)
    warm, timed = sentences[: len(sentences) // 10], sentences[len(sentences) // 10 :]
    n_tokens = sum(len(s) for s in timed)
    embedder = Embedder(bilm, max_batch_tokens=args.batch_tokens)
    with tempfile.TemporaryDirectory() as folder:
        export_bilm(bilm, Path(folder), formats=["onnx"])
        session = onnxruntime.InferenceSession(
            str(Path(folder) / ONNX_FILE), providers=["CPUExecutionProvider"]
        )
    results = {}
    for side, run in (
        ("embedder", embedder.embed),
        ("onnxruntime", lambda batch: run_onnx(session, bilm, batch, args.batch_tokens)),
    ):
        run(warm)
        started = time.perf_counter()
        run(timed)
        seconds = time.perf_counter() - started
        results[side] = n_tokens / seconds
        line = {"side": side, "biLM": name, "sentences": len(timed), "tokens": n_tokens}
        line.update(seconds=round(seconds, 2), tokens_per_second=round(n_tokens / seconds))
        print(json.dumps(line), flush=True)
    ratio = results["onnxruntime"] / results["embedder"]
    print(f"onnxruntime / Embedder: {ratio:.2f}x the tokens/s ({torch.get_num_threads()} threads)")


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


def read_sentences(path: Path | None, n: int) -> list[list[str]]:
    if path is None:
        path = Path(spacy.util.get_package_path("elmo_spacy")) / "data" / "sample.txt"
    lines = [line.split() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    return [lines[i % len(lines)] for i in range(n)]


if __name__ == "__main__":
    main()
