"""How far zero and primed starting states leave the biLM from the reference
outputs, which bilm-tf computed with the LSTM state carried across batches.

    .venv/bin/python benchmarks/primed_state.py [../shared/data/allennlp_elmo]

The reference fixture (see its README) ran 10 batches of 3 sentences in
order, each batch row starting from the state that the previous batch left
in that row. Batch 0 started from zeros; batches 1 to 9 did not, and those
are compared here: the top layer of the two sentences of each batch that
have reference outputs (18 sentences, 2 x 16 values a token), run
- from zero state (`state = "zero"`, each batch alone),
- from the primed state (`state = "primed"`, the default warm-up text),
- replaying the reference's carried state (`BiLM.stateful`: the check that
  the comparison itself is right).
Prints a markdown table of the max and mean absolute difference.
"""

import argparse
import json
from pathlib import Path

import h5py
import numpy
import torch

from elmo_spacy.bilm import BiLM
from elmo_spacy.bilm.formats.bilm_tf import read_bilm_tf
from elmo_spacy.bilm.runner import Runner, RunSettings

FIXTURES = Path(__file__).parents[1].parent / "shared" / "data" / "allennlp_elmo"


def reference_batches(fixtures: Path) -> list[list[list[str]]]:
    """The 10 batches the reference ran, each 3 tokenised sentences."""
    sentences = json.loads((fixtures / "sentences.json").read_text())
    return [[sentences[k][i].split() for k in range(3)] for i in range(10)]


def reference_top_layers(fixtures: Path, i: int) -> list[numpy.ndarray]:
    """The reference's top layer, [forward; backward] (n, 2P), of sentence i
    of sentences[0] and sentences[1]."""
    tops = []
    for k in range(2):
        with h5py.File(fixtures / f"lm_embeddings_{k}.hdf5") as file:
            both = file[str(i)][...]
        tops.append(numpy.concatenate([both[0], both[1]], axis=1))
    return tops


def differences(bilm: BiLM, fixtures: Path, state: str) -> numpy.ndarray:
    """Absolute differences of the top layer on batches 1 to 9, all values
    together. state: "zero", "primed", or "carried" (the stateful replay,
    which runs batch 0 too, to carry its state)."""
    batches = reference_batches(fixtures)
    bilm.stateful = state == "carried"
    bilm.reset_state()
    initial = None
    if state != "carried":
        initial = Runner(bilm, RunSettings(state=state, precision=bilm.precision)).initial_states()
    gaps = []
    try:
        for i, batch in enumerate(batches):
            if i == 0 and state != "carried":
                continue
            with torch.inference_mode():
                top = bilm(bilm.batch(batch), initial)[-1].numpy()
            if i == 0:
                continue
            for k, reference in enumerate(reference_top_layers(fixtures, i)):
                gaps.append(numpy.abs(top[k, : len(batch[k])] - reference).ravel())
    finally:
        bilm.stateful = False
        bilm.reset_state()
    return numpy.concatenate(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixtures", nargs="?", type=Path, default=FIXTURES)
    args = parser.parse_args()
    bilm = read_bilm_tf(args.fixtures / "options.json", args.fixtures / "lm_weights.hdf5")
    print("| start of each batch (1-9) | max abs diff | mean abs diff |")
    print("| --- | --- | --- |")
    for state, label in (
        ("zero", "zero state"),
        ("primed", "primed state (default warm-up)"),
        ("carried", "carried state (stateful replay)"),
    ):
        gaps = differences(bilm, args.fixtures, state)
        print(f"| {label} | {gaps.max():.3g} | {gaps.mean():.3g} |")


if __name__ == "__main__":
    main()
