"""What replacing the listeners costs on disk: a pipeline of an `elmo` pipe
and N listening pipes (textcat, ner, tagger), saved before and after
`nlp.replace_listeners`, and the bytes of each component's folder.

    python benchmarks/replaced_on_disk.py [--shape small] [--pipes textcat ner tagger]

The biLM has random weights of a shape of benchmarks/elmo_shapes.py and the
four specials for a vocabulary (a char-CNN biLM without its softmax, as the
`elmo` pipe saves it); sizes do not depend on the weights. Prints one JSON
line per saved pipeline.
"""

import argparse
import json
import tempfile
from pathlib import Path

import spacy
import torch
from elmo_shapes import SHAPES, elmo_config
from spacy.tokens import Doc
from spacy.training import Example

from elmo_spacy.bilm import BiLM, WordVocab, save_bilm

SHAPE_NAMES = {name.split()[0]: name for name in SHAPES}
LISTENER = {
    "@architectures": "elmo_spacy.ElmoListener.v1",
    "upstream": "elmo",
    "grad_factor": 0.0,
    "width": 64,
    "mix": {"@architectures": "elmo_spacy.ScalarMix.v1"},
}
MODELS = {
    "textcat": {
        "@architectures": "spacy.TextCatReduce.v1",
        "exclusive_classes": True,
        "use_reduce_first": False,
        "use_reduce_last": False,
        "use_reduce_max": False,
        "use_reduce_mean": True,
    },
    "ner": {"@architectures": "spacy.TransitionBasedParser.v2", "state_type": "ner"},
    "tagger": {"@architectures": "spacy.Tagger.v2"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPE_NAMES), default="small")
    parser.add_argument("--pipes", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    args = parser.parse_args()
    torch.manual_seed(0)
    config = elmo_config(**SHAPES[SHAPE_NAMES[args.shape]])
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        save_bilm(BiLM(config, WordVocab.specials_only(), with_softmax=False), work / "bilm")
        nlp = spacy.blank("en")
        nlp.add_pipe("elmo")
        for name in args.pipes:
            nlp.add_pipe(name, config={"model": {**MODELS[name], "tok2vec": LISTENER}})
        doc = Doc(nlp.vocab, words=["Oil", "rose", "."], tags=["NN", "VBD", "."])
        doc.ents = [doc.char_span(0, 3, label="ORG")]
        doc.cats = {"A": 1.0, "B": 0.0}
        nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=work / "bilm")
        with nlp.select_pipes(disable=["elmo"]):
            nlp.initialize(lambda: [Example(nlp.make_doc(doc.text), doc)])
        report(nlp, work / "listening", "listeners")
        for name in args.pipes:
            nlp.replace_listeners("elmo", name, ["model.tok2vec"])
        nlp.remove_pipe("elmo")
        report(nlp, work / "replaced", "replaced, elmo pipe removed")


def report(nlp, path: Path, what: str) -> None:
    nlp.to_disk(path)
    sizes = {p.name: folder_bytes(p) for p in sorted(path.iterdir()) if p.is_dir()}
    line = {"pipeline": what, "total_mb": round(folder_bytes(path) / 2**20, 2)}
    line.update({f"{name}_mb": round(size / 2**20, 2) for name, size in sizes.items()})
    print(json.dumps(line), flush=True)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


if __name__ == "__main__":
    main()
