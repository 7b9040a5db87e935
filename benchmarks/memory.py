"""Memory of a pipeline under load (Linux: reads the kernel's counters in /proc).

    python benchmarks/memory.py long-doc PIPELINE [--tokens 100000] [--window W] [--exclude textcat]
    python benchmarks/memory.py many-docs PIPELINE [--docs 50000]

long-doc: one doc of --tokens tokens; the peak resident size above the size
    before the call (VmHWM, reset through /proc/self/clear_refs) and the size of
    the doc's output (`doc._.elmo` and `doc.tensor`), in MB. --window overrides
    the `elmo` pipe's window; one longer than the doc runs it in one piece.
many-docs: `nlp.pipe` over --docs short docs; the resident size (VmRSS) every
    5,000 docs, in MB. The texts repeat 1,000 distinct ones: new strings grow
    spaCy's StringStore by design, which is not a leak.

Each prints one JSON line.
"""

import argparse
import json

import spacy

from elmo_spacy.layers import get_runner


def resident_mb(field: str) -> float:
    """VmRSS (resident now) or VmHWM (peak since the last reset) of this process, in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def long_doc(nlp: spacy.Language, n_tokens: int) -> dict:
    text = " ".join(["Markets", "rallied", "on", "Friday", "."] * (n_tokens // 5))
    nlp(text[:5000])  # warm up: allocator pools, lazy imports
    before = resident_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # reset VmHWM
    doc = nlp(text)
    return {
        "tokens": len(doc),
        "pipes": nlp.pipe_names,
        "window": get_runner(nlp.get_pipe("elmo").model).settings.window,
        "peak_over_start_mb": round(resident_mb("VmHWM") - before, 1),
        "output_mb": round((doc._.elmo.nbytes + doc.tensor.nbytes) / 2**20, 1),
    }


def many_docs(nlp: spacy.Language, n_docs: int) -> dict:
    texts = (f"Story {i % 1000}: shares of company {i % 97} rose." for i in range(n_docs))
    rss = []
    for i, _ in enumerate(nlp.pipe(texts, batch_size=256)):
        if i % 5_000 == 4_999:
            rss.append(round(resident_mb("VmRSS"), 1))
    return {"docs": n_docs, "rss_mb_every_5000_docs": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    one = sub.add_parser("long-doc")
    one.add_argument("pipeline")
    one.add_argument("--tokens", type=int, default=100_000)
    one.add_argument("--window", type=int, default=None)
    one.add_argument("--exclude", nargs="*", default=[])
    many = sub.add_parser("many-docs")
    many.add_argument("pipeline")
    many.add_argument("--docs", type=int, default=50_000)
    args = parser.parse_args()

    if args.mode == "long-doc":
        config = (
            {}
            if args.window is None
            else {"components": {"elmo": {"model": {"run": {"window": args.window}}}}}
        )
        nlp = spacy.load(args.pipeline, exclude=args.exclude, config=config)
        print(json.dumps(long_doc(nlp, args.tokens)))
    else:
        print(json.dumps(many_docs(spacy.load(args.pipeline), args.docs)))


if __name__ == "__main__":
    main()
