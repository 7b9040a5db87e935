"""Inference throughput and peak memory of pipelines over the same docs, in one run.

    python benchmarks/inference.py corpus/dev.spacy training/scalar/model-best training/ensemble/model-best training/minilm/model-best [--batch-size 128]

Each pipeline runs in a fresh process (so peak memory is its own): it loads,
warms up on 50 docs, then `nlp.pipe` goes over all the docs' texts once.
Prints one JSON line per pipeline: words/s, and the peak resident size (VmHWM)
after loading and over the whole run, in MB.
"""

import argparse
import subprocess
import sys
from pathlib import Path

MEASURE = """
import json, sys, time
import spacy, torch
from spacy.tokens import DocBin
sys.path.insert(0, {benchmarks!r})
from memory import resident_mb

nlp = spacy.load({pipeline!r})
loaded_mb = resident_mb("VmHWM")
docs = list(DocBin().from_disk({docs!r}).get_docs(nlp.vocab))
texts = [doc.text for doc in docs]
list(nlp.pipe(texts[:50], batch_size={batch_size}))
started = time.perf_counter()
n_words = sum(len(doc) for doc in nlp.pipe(texts, batch_size={batch_size}))
seconds = time.perf_counter() - started
print(json.dumps({{
    "pipeline": {pipeline!r}, "pipes": nlp.pipe_names, "docs": len(texts), "words": n_words,
    "batch_size": {batch_size}, "torch_threads": torch.get_num_threads(),
    "words_per_second": round(n_words / seconds), "peak_mb_after_load": round(loaded_mb),
    "peak_mb": round(resident_mb("VmHWM")),
}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("docs", help="A .spacy file of docs")
    parser.add_argument("pipelines", nargs="+")
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    for pipeline in args.pipelines:
        script = MEASURE.format(
            benchmarks=str(Path(__file__).parent),
            pipeline=pipeline,
            docs=args.docs,
            batch_size=args.batch_size,
        )
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"{pipeline} failed:\n{result.stderr[-2000:]}")
        print(result.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
