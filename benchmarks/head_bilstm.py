"""Time of the textcat head's BiLSTM (`TorchBiLSTM`, as `scripts.TextCatBiLSTM.v1`
builds it) against torch's bidirectional LSTM on packed sequences, the same
weights and batches, in one run.

    python benchmarks/head_bilstm.py [--text ../shared/data/ag_news/train.csv] [--docs 2000] [--width 512] [--rounds 3]

The batches are the token counts of the first `--docs` AG News rows (spaCy's
English tokenizer), about 1,000 words each, as `configs/textcat_*.cfg` batch
them; the inputs random vectors of `--width` (256: the workflow's biLM, 512:
the wide one). Each way runs every batch forward and backward (training) and
forward alone (prediction), best of `--rounds`. Prints one JSON line per way
and mode, then the ratios.
"""

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy
import spacy
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))  # the study's head lives in scripts/

from scripts.components import TorchBiLSTM  # noqa: E402

HIDDEN, DEPTH, BATCH_WORDS = 128, 2, 1000  # configs/textcat_*.cfg


def doc_lengths(path: Path, n: int) -> list[int]:
    with path.open(encoding="utf-8") as lines:
        texts = [" ".join(row[1:]) for _, row in zip(range(n), csv.reader(lines))]
    return [len(doc) for doc in spacy.blank("en").tokenizer.pipe(texts)]


def batches(lengths: list[int], width: int) -> list[list[numpy.ndarray]]:
    rng = numpy.random.default_rng(0)
    out, batch, words = [], [], 0
    for n in lengths:
        batch.append(rng.normal(size=(n, width)).astype("float32"))
        words += n
        if words >= BATCH_WORDS:
            out.append(batch)
            batch, words = [], 0
    return out + ([batch] if batch else [])


def run_packed(lstm: torch.nn.LSTM, batch: list[numpy.ndarray], train: bool) -> None:
    with torch.set_grad_enabled(train):
        inputs = pad_sequence([torch.from_numpy(x) for x in batch], batch_first=True)
        lengths = torch.tensor([len(x) for x in batch])
        packed = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        outputs = pad_packed_sequence(lstm(packed)[0], batch_first=True)[0]
        if train:
            outputs.sum().backward()


def run_layer(layer, batch: list[numpy.ndarray], train: bool) -> None:
    if train:
        Y, backprop = layer.begin_update(batch)
        backprop([numpy.ones_like(y) for y in Y])
    else:
        layer.predict(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=ROOT.parent / "shared/data/ag_news/train.csv")
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    data = batches(doc_lengths(args.text, args.docs), args.width)
    words = sum(len(x) for batch in data for x in batch)
    layer = TorchBiLSTM(nO=2 * HIDDEN, depth=DEPTH)
    layer.initialize(X=data[0])
    packed = torch.nn.LSTM(args.width, HIDDEN, DEPTH, bidirectional=True, batch_first=True)
    packed.load_state_dict({n: torch.from_numpy(layer.get_param(n)) for n in layer.param_names})
    ways = {
        "packed sequences (torch.nn.LSTM)": lambda batch, train: run_packed(packed, batch, train),
        "TorchBiLSTM": lambda batch, train: run_layer(layer, batch, train),
    }
    speed = {}
    for mode, train in (("train", True), ("predict", False)):
        for way, run in ways.items():
            seconds = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                for batch in data:
                    run(batch, train)
                seconds.append(time.perf_counter() - started)
            speed[mode, way] = words / min(seconds)
            row = {"mode": mode, "way": way, "words": words, "batches": len(data)}
            print(json.dumps({**row, "seconds": min(seconds), "words_per_s": speed[mode, way]}))
    for mode in ("train", "predict"):
        ratio = speed[mode, "TorchBiLSTM"] / speed[mode, "packed sequences (torch.nn.LSTM)"]
        print(f"{mode}: TorchBiLSTM {ratio:.2f}x packed sequences (width {args.width})")


if __name__ == "__main__":
    main()
