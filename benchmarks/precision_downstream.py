"""A trained pipeline's dev scores and speed with its `elmo` pipe in each precision, in one run.

    python benchmarks/precision_downstream.py training/ner/elmo/model-best corpus/ner/dev.spacy
        [--precisions float32 bfloat16] [--batch-size 64] [--threads 2] [--int8-lstm]

The heads were trained with the biLM in float32; only the biLM's precision
changes. For each precision: warms up on 50 docs, then `nlp.evaluate` over
all the docs, and prints one JSON line with the pipeline's scores (those
that are numbers: ents_f, pos_acc, ...) and words/s; last, the difference of
each score from float32's. With --int8-lstm, one more run: the LSTM's
products in int8 (torch's dynamic quantization, weights per output channel),
the rest in float32: what an int8 precision would give. The package has none
(README, "Precision").
"""

import argparse
import contextlib
import json
import time

import spacy
import torch
from spacy.tokens import Doc, DocBin
from spacy.training import Example
from step_gemm_rates import int8_lstm_products

from elmo_spacy.bilm.runtime.precision import PRECISIONS
from elmo_spacy.layers import get_bilm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline")
    parser.add_argument("docs", help="a .spacy file of gold docs (dev)")
    parser.add_argument("--precisions", nargs="*", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--int8-lstm", action="store_true", help="Also run the LSTM in int8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    def examples_of(nlp: spacy.Language) -> list[Example]:
        """The gold docs, on the gold tokens, as the workflows evaluate
        (scripts/token_evaluate.py)."""
        gold = DocBin().from_disk(args.docs).get_docs(nlp.vocab)
        words = [([t.text for t in d], [bool(t.whitespace_) for t in d], d) for d in gold]
        return [Example(Doc(nlp.vocab, words=w, spaces=s), d) for w, s, d in words]

    n_words = sum(len(eg.reference) for eg in examples_of(spacy.blank("en")))
    scores = {}
    runs = [(p, contextlib.nullcontext()) for p in args.precisions]
    if args.int8_lstm:
        runs.append(("int8_lstm", int8_lstm_products()))
    for precision, scope in runs:
        setting = "float32" if precision == "int8_lstm" else precision
        nlp = spacy.load(
            args.pipeline,
            config={"components": {"elmo": {"model": {"run": {"precision": setting}}}}},
        )
        examples = examples_of(nlp)
        elmo = nlp.get_pipe("elmo")
        with scope:
            warm_up = [eg.predicted.copy() for eg in examples[:50]]
            list(nlp.pipe(warm_up, batch_size=args.batch_size))
            elmo.frozen_cache.clear()  # every doc computed in the timed run
            started = time.perf_counter()
            result = nlp.evaluate(examples, batch_size=args.batch_size)
            seconds = time.perf_counter() - started
        scores[precision] = {k: v for k, v in result.items() if isinstance(v, float)}
        ran = precision if precision == "int8_lstm" else get_bilm(elmo.model).precision
        line = {"precision": ran, "words": n_words}
        line["words_per_second"] = round(n_words / seconds)
        print(json.dumps({**line, **scores[precision]}), flush=True)
    if "float32" in scores:
        for precision, values in scores.items():
            if precision != "float32":
                base = scores["float32"]
                diff = {k: round(v - base[k], 5) for k, v in values.items() if k in base}
                print(json.dumps({f"{precision}_minus_float32": diff}))


if __name__ == "__main__":
    main()
