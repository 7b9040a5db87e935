"""Bytes a token that a Doc keeps, for each choice of the `elmo` pipe's
`store` and `dtype` settings: in memory (`doc._.elmo` and `doc.tensor`), in a
DocBin with user data (what `spacy apply` writes) and pickled.

    python benchmarks/doc_storage.py [--shape original] [--texts N]

The biLM is one of random weights of the given shape: "original" is ELMo's
2x4096_512 (3 layers of 1,024), "small" 2x1024_128 (3 layers of 256). The
sizes in memory and pickled follow from the shape alone; DocBin compresses
(zlib), so its figure depends on the values too. The texts are the plugin's
sample sentences. Prints one JSON line per choice, then a markdown table.
"""

import argparse
import json
import pickle
import tempfile
from pathlib import Path

import spacy
import torch
from elmo_shapes import SHAPES, elmo_config
from spacy.tokens import DocBin

from elmo_spacy.bilm import BiLM, WordVocab, save_bilm

STORES = ["layers", [2], "tensor", "nothing"]
SHAPE_NAMES = {name.split()[0]: name for name in SHAPES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPE_NAMES), default="original")
    parser.add_argument("--texts", type=int, default=100, help="Sample sentences embedded")
    args = parser.parse_args()
    torch.manual_seed(0)
    sample = Path(spacy.util.get_package_path("elmo_spacy")) / "data" / "sample.txt"
    texts = sample.read_text(encoding="utf-8").splitlines()[: args.texts]
    config = elmo_config(**SHAPES[SHAPE_NAMES[args.shape]])
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        save_bilm(BiLM(config, WordVocab.specials_only(), with_softmax=False), Path(folder) / "b")
        for store in STORES:
            for dtype in ("float32", "float16"):
                if store == "nothing" and dtype == "float16":
                    continue
                nlp = spacy.blank("en")
                elmo = nlp.add_pipe("elmo", config={"store": store, "dtype": dtype})
                elmo.initialize(lambda: [], bilm_path=Path(folder) / "b")
                docs = list(nlp.pipe(texts))
                n_tokens = sum(len(doc) for doc in docs)
                memory = sum(
                    (0 if doc._.elmo is None else doc._.elmo.nbytes) + doc.tensor.nbytes
                    for doc in docs
                )
                docbin = DocBin(store_user_data=True, docs=docs).to_bytes()
                pickled = pickle.dumps(docs)
                bare = DocBin(store_user_data=True, docs=list(spacy.blank("en").pipe(texts)))
                row = {
                    "store": store,
                    "dtype": dtype,
                    "tokens": n_tokens,
                    "memory_bytes_per_token": round(memory / n_tokens),
                    "docbin_bytes_per_token": round(len(docbin) / n_tokens),
                    "docbin_without_elmo_bytes_per_token": round(len(bare.to_bytes()) / n_tokens),
                    "pickle_bytes_per_token": round(len(pickled) / n_tokens),
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"\nshape {SHAPE_NAMES[args.shape]}, {rows[0]['tokens']} tokens; bytes a token")
    print("| store | dtype | in memory | DocBin | pickle |")
    print("|---|---|---:|---:|---:|")
    for row in rows:
        print(
            f"| {json.dumps(row['store'])} | {row['dtype']} | {row['memory_bytes_per_token']:,} "
            f"| {row['docbin_bytes_per_token']:,} | {row['pickle_bytes_per_token']:,} |"
        )
    bare_size = rows[0]["docbin_without_elmo_bytes_per_token"]
    print(f"(a DocBin of the same docs without ELMo: {bare_size} bytes a token)")


if __name__ == "__main__":
    main()
