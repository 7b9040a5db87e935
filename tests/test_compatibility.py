"""What users saved with an earlier version still works: a pipeline and a
training config made by the version before the run settings moved to the
`elmo` pipe's model block (tests/data/cb28a09, written by commit cb28a09:
an `elmo` pipe with layers [0, 2] and a primed state, and a textcat on its
listener; the same after `replace_listeners`; their predictions)."""

import subprocess
import sys
import warnings

import pytest
import spacy
from spacy.training import Example

from elmo_spacy.layers import get_runner

from .conftest import DATA

SAVED = DATA / "cb28a09"
TEXTS = ["the cat sat on the mat .", "stocks rose on tuesday .", "the team won the final match ."]
MOVED = "layers, state, warmup, precision moved to the model's block"

LOAD_AND_PREDICT = """
import sys, numpy, spacy, warnings
saved = numpy.load(sys.argv[1])
for name in ("shared", "replaced"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FutureWarning)
        nlp = spacy.load(sys.argv[2] + "/" + name)
    print(name, "warned:", *(str(w.message) for w in caught))
    for i, doc in enumerate(nlp.pipe(sys.argv[3:])):
        assert numpy.asarray(doc._.elmo).tobytes() == saved[f"{name}/elmo/{i}"].tobytes(), i
        cats = numpy.array([doc.cats["A"], doc.cats["B"]])
        assert cats.tobytes() == saved[f"{name}/cats/{i}"].tobytes(), i
    print(name, "same predictions")
"""


def test_pipelines_saved_before_load_in_a_fresh_process_and_predict_the_same():
    """Both the pipeline and its replaced-listener twin, in one process."""
    command = [sys.executable, "-c", LOAD_AND_PREDICT, str(SAVED / "predictions.npz"), str(SAVED)]
    result = subprocess.run(command + TEXTS, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for name in ("shared", "replaced"):
        (warned,) = [line for line in lines if line.startswith(f"{name} warned:")]
        assert MOVED in warned and "[components.elmo.model]" in warned
        assert f"{name} same predictions" in lines
    (replaced,) = [line for line in lines if line.startswith("replaced warned:")]
    assert "elmo_spacy.ElmoTok2Vec.v1: " + MOVED in replaced


def test_the_settings_of_a_pipeline_saved_before_are_its_model_s_after_replace_listeners(tmp_path):
    with pytest.warns(FutureWarning, match=MOVED):
        nlp = spacy.load(SAVED / "shared")
    assert get_runner(nlp.get_pipe("elmo").model).settings.state == "primed"
    nlp.replace_listeners("elmo", "textcat", ["model.tok2vec"])
    block = nlp.config["components"]["textcat"]["model"]["tok2vec"]
    assert {key: block["bilm"][key] for key in ("layers", "state", "warmup", "precision")} == {
        "layers": [0, 2],
        "state": "primed",
        "warmup": ["the cat sat ."],
        "precision": "float32",
    }
    assert not {"layers", "state", "warmup", "precision"} & set(block)
    nlp.remove_pipe("elmo")
    nlp.to_disk(tmp_path / "replaced")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # nothing left in the former place
        loaded = spacy.load(tmp_path / "replaced")
    for doc, again in zip(nlp.pipe(TEXTS), loaded.pipe(TEXTS)):
        assert doc.cats == again.cats


def test_a_training_config_written_before_still_trains():
    config = spacy.util.load_config(SAVED / "textcat.cfg")
    config["initialize"]["components"]["elmo"]["bilm_path"] = str(SAVED / "bilm")
    with pytest.warns(FutureWarning, match=r"\[components.elmo\]: " + MOVED):
        nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    assert nlp.get_pipe("elmo").run_settings.layers == (0, 2)
    examples = [
        Example.from_dict(nlp.make_doc(text), {"cats": {"A": float(i % 2 == 0), "B": float(i % 2)}})
        for i, text in enumerate(TEXTS)
    ]
    nlp.initialize(lambda: examples)
    losses = {}
    for _ in range(2):
        nlp.update(examples, losses=losses)
    assert losses["textcat"] > 0
    assert nlp(TEXTS[0])._.elmo.shape[0] == 2  # layers [0, 2]
