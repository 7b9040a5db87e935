"""How close ELMoForManyLangs' own runtime comes to its fixture outputs on this
CPU, beside this package's reader: the yardstick behind tests/test_efml.py.

Needs the reference installed beside the package (it is not a dependency):
    pip install --no-deps --target /tmp/efml elmoformanylangs==0.0.4.post2 overrides==3.1.0
    PYTHONPATH=/tmp/efml python benchmarks/efml_reference.py [../shared/data/elmoformanylangs]

Prints, over the fixture's 12 sentences (each from zero state, a fresh
Embedder per sentence), the largest and the largest per-sentence mean absolute
difference of the LSTM layers for: the reference run here against its
fixture, the reference alone against the reference in one batch of 12, this
package against the fixture, and this package against the reference run here.
"""

import json
import logging
import sys
from pathlib import Path

import h5py
import numpy
import torch

from elmo_spacy.bilm import load_bilm


def main(fixture: Path) -> None:
    from elmoformanylangs import Embedder

    logging.disable(logging.CRITICAL)
    model = str(fixture / "model")
    sentences = [s.split(" ") for s in json.loads((fixture / "sentences.json").read_text())]
    with h5py.File(fixture / "outputs.hdf5", "r") as file:
        fixture_outputs = [file[str(i)][...] for i in range(len(sentences))]
    alone = [Embedder(model).sents2elmo([s], output_layer=-2)[0] for s in sentences]
    together = Embedder(model).sents2elmo(sentences, output_layer=-2)
    bilm = load_bilm(model)
    with torch.no_grad():
        ours = [bilm(bilm.batch([s]))[:, 0].numpy() for s in sentences]
    pairs = {
        "reference here vs fixture": (alone, fixture_outputs),
        "reference alone vs in a batch of 12": (alone, together),
        "elmo_spacy vs fixture": (ours, fixture_outputs),
        "elmo_spacy vs reference here": (ours, alone),
    }
    print("LSTM layers (1 and 2)                 max abs    max sentence mean")
    for name, (a, b) in pairs.items():
        gaps = [numpy.abs(x[1:] - y[1:]) for x, y in zip(a, b)]
        worst = max(float(g.max()) for g in gaps)
        mean = max(float(g.mean()) for g in gaps)
        print(f"{name:<37} {worst:.2e}   {mean:.2e}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/elmoformanylangs"))
