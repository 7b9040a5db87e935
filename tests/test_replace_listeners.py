"""Listeners replaced by their own copy of the biLM (spaCy's `replace_listeners`,
in Python, on `spacy train` output and in a config's `source`), saved, and
loaded again in a fresh process with the same predictions; and
`elmo_spacy.ElmoTok2Vec.v1` in a config of its own."""

import json
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import spacy
import torch
from spacy.tokens import Doc, DocBin
from spacy.training import Example

from elmo_spacy.layers import get_bilm

PIPES = ("textcat", "ner", "tagger")
TEXTS = [
    "Oil prices rose in London on Monday .",
    "Shares of Acme fell sharply in Paris .",
    "Berlin won the cup again .",
    " ".join(["Markets in Tokyo rallied ."] * 60),  # longer than the window below
]
SENTENCES = [
    (["Oil", "prices", "rose", "in", "London", "."], "Business", [(4, "LOC")]),
    (["Acme", "shares", "fell", "in", "Paris", "."], "Business", [(0, "ORG"), (4, "LOC")]),
    (["Berlin", "won", "the", "cup", "."], "Sports", [(0, "ORG")]),
    (["Smith", "scored", "twice", "in", "Madrid", "."], "Sports", [(0, "PER"), (4, "LOC")]),
]
TAGS = {"Oil": "NN", "prices": "NNS", "shares": "NNS", "rose": "VBD", "fell": "VBD", "won": "VBD"}
CONFIG = """
[paths]
train = null
dev = null
bilm = null

[nlp]
lang = "en"
pipeline = ["elmo", "textcat", "ner", "tagger"]

[components]

[components.elmo]
factory = "elmo"

[components.elmo.model]
@architectures = "elmo_spacy.ElmoBiLM.v1"

[components.elmo.model.run]
@misc = "elmo_spacy.RunSettings.v1"
state = "primed"
layers = [0, 2]
window = 40
window_overlap = 8

[components.textcat]
factory = "textcat"

[components.textcat.model]
@architectures = "spacy.TextCatReduce.v1"
exclusive_classes = true
use_reduce_first = false
use_reduce_last = false
use_reduce_max = true
use_reduce_mean = true

[components.textcat.model.tok2vec]
@architectures = "elmo_spacy.ElmoListener.v1"
upstream = "elmo"
grad_factor = 0.0
width = 16

[components.textcat.model.tok2vec.mix]
@architectures = "elmo_spacy.ScalarMix.v1"

[components.ner]
factory = "ner"

[components.ner.model]
@architectures = "spacy.TransitionBasedParser.v2"
state_type = "ner"
hidden_width = 16
maxout_pieces = 2

[components.ner.model.tok2vec]
@architectures = "elmo_spacy.ElmoListener.v1"
upstream = "elmo"
grad_factor = 1.0
width = 16

[components.ner.model.tok2vec.mix]
@architectures = "elmo_spacy.LearnedMix.v1"
nO = 12

[components.tagger]
factory = "tagger"

[components.tagger.model]
@architectures = "spacy.Tagger.v2"

[components.tagger.model.tok2vec]
@architectures = "elmo_spacy.ElmoListener.v1"
upstream = "elmo"
grad_factor = 0.5

[components.tagger.model.tok2vec.mix]
@architectures = "elmo_spacy.ScalarMix.v1"
trainable = false

[corpora]

[corpora.train]
@readers = "spacy.Corpus.v1"
path = ${paths.train}

[corpora.dev]
@readers = "spacy.Corpus.v1"
path = ${paths.dev}

[training]
max_steps = 4
eval_frequency = 2
patience = 0
max_epochs = 0

[training.batcher]
@batchers = "spacy.batch_by_words.v1"
size = 60

[initialize]

[initialize.components]

[initialize.components.elmo]
bilm_path = ${paths.bilm}
"""
PREDICT = """
texts = json.loads(sys.argv[1])
for path in sys.argv[2:]:
    numpy.savez(path + ".npz", **predictions(spacy.load(path), texts))
"""


def docs_with_annotations(vocab) -> list[Doc]:
    docs = []
    for words, label, entities in SENTENCES * 4:
        doc = Doc(vocab, words=words, tags=[TAGS.get(w, "NNP") for w in words])
        doc.cats = {"Business": float(label == "Business"), "Sports": float(label == "Sports")}
        doc.ents = [spacy.tokens.Span(doc, i, i + 1, label=e) for i, e in entities]
        docs.append(doc)
    return docs


def predictions(nlp, texts: list[str]) -> dict[str, numpy.ndarray]:
    """What each pipe predicts, and its tok2vec's output, as arrays."""
    docs = list(nlp.pipe(texts))
    result = {
        "cats": numpy.array([[doc.cats[k] for k in sorted(doc.cats)] for doc in docs]),
        "ents": numpy.array(
            [json.dumps([(e.start, e.end, e.label_) for e in doc.ents]) for doc in docs]
        ),
        "tags": numpy.array([json.dumps([t.tag_ for t in doc]) for doc in docs]),
    }
    for name in ("textcat", "ner", "tagger"):
        tok2vec = nlp.get_pipe(name).model.get_ref("tok2vec")
        for i, vectors in enumerate(tok2vec.predict([nlp.make_doc(t) for t in texts])):
            result[f"{name}-{i}"] = numpy.asarray(vectors)
    return result


def predictions_in_a_fresh_process(paths: list[Path]) -> list[dict[str, numpy.ndarray]]:
    """`predictions` of the pipelines at `paths`, each loaded by `spacy.load`
    in one new process."""
    import inspect

    code = "import json, sys, numpy, spacy\n" + inspect.getsource(predictions) + PREDICT
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(TEXTS), *map(str, paths)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [dict(numpy.load(f"{path}.npz")) for path in paths]


def assert_same(expected: dict, got: dict) -> None:
    assert expected.keys() == got.keys()
    for key in expected:
        assert numpy.array_equal(expected[key], got[key]), key


@pytest.fixture(scope="module")
def trained_dir(bilm_dir, tmp_path_factory) -> Path:
    """`spacy train` on a pipeline of an elmo pipe and three listening pipes:
    textcat (frozen biLM), ner (fine-tuned), tagger (half the gradient)."""
    from spacy.cli.init_config import fill_config
    from spacy.cli.train import train

    folder = tmp_path_factory.mktemp("replace")
    vocab = spacy.blank("en").vocab
    DocBin(docs=docs_with_annotations(vocab)).to_disk(folder / "train.spacy")
    (folder / "base.cfg").write_text(CONFIG)
    fill_config(folder / "config.cfg", folder / "base.cfg", silent=True)
    overrides = {
        "paths.train": str(folder / "train.spacy"),
        "paths.dev": str(folder / "train.spacy"),
        "paths.bilm": str(bilm_dir),
    }
    train(folder / "config.cfg", folder / "output", overrides=overrides)
    return folder / "output" / "model-last"


def inline_bilm(model):
    """The biLM model that a pipe's `model` runs in its listener's place."""
    (inline,) = [n for n in model.walk() if n.name == "elmo_inline_bilm"]
    return inline.layers[0]


def replaced(nlp):
    for name in PIPES:
        nlp.replace_listeners("elmo", name, ["model.tok2vec"])
    return nlp


def test_replaced_listeners_predict_the_same_and_reload_in_a_fresh_process(trained_dir, tmp_path):
    """Replaced in Python on `spacy train` output, and by a config that
    sources the pipes with `replace_listeners` (what `spacy assemble` runs):
    the same predictions, before and after `spacy.load` in a fresh process."""
    nlp = spacy.load(trained_dir)
    expected = predictions(nlp, TEXTS)
    assert "NN" in expected["tags"][0]  # the pipes predict something
    elmo = nlp.get_pipe("elmo")
    elmo_bilm = get_bilm(elmo.model)
    replaced(nlp)
    assert elmo.listener_map == {}
    for name in PIPES:
        assert get_bilm(inline_bilm(nlp.get_pipe(name).model)) is not elmo_bilm  # a copy of its own
        block = nlp.config["components"][name]["model"]["tok2vec"]
        assert block["@architectures"] == "elmo_spacy.ElmoTok2Vec.v1"
        run = block["bilm"]["run"]
        assert (run["state"], run["layers"], run["window"]) == ("primed", [0, 2], 40)
    assert nlp.config["components"]["ner"]["model"]["tok2vec"]["mix"]["nO"] == 12
    assert nlp.config["components"]["tagger"]["model"]["tok2vec"]["grad_factor"] == 0.5
    assert_same(expected, predictions(nlp, TEXTS))
    nlp.remove_pipe("elmo")
    assert_same(expected, predictions(nlp, TEXTS))
    nlp.to_disk(tmp_path / "replaced")

    sourced = [
        f'[components.{name}]\nsource = "{trained_dir}"\nreplace_listeners = ["model.tok2vec"]'
        for name in PIPES
    ]
    config = "\n".join(
        ["[nlp]", 'lang = "en"', f"pipeline = {json.dumps(list(PIPES))}", "[components]", *sourced]
    )
    # what `spacy assemble` does with the config
    assembled = spacy.util.load_model_from_config(
        spacy.util.load_config_from_str(config), auto_fill=True
    )
    assert assembled.pipe_names == list(PIPES)
    assembled.to_disk(tmp_path / "assembled")

    loaded = predictions_in_a_fresh_process([tmp_path / "replaced", tmp_path / "assembled"])
    for got in loaded:
        assert_same(expected, got)


def test_training_goes_on_with_the_replaced_pipes_own_biLM(trained_dir, tmp_path):
    """A resumed `spacy train` on the replaced pipeline: the ner's own biLM
    (grad_factor 1) moves, the textcat's (grad_factor 0) does not."""
    from spacy.cli.train import train

    nlp = replaced(spacy.load(trained_dir))
    nlp.remove_pipe("elmo")
    nlp.to_disk(tmp_path / "replaced")

    def weights(nlp, name):
        return {
            k: v.clone()
            for k, v in get_bilm(inline_bilm(nlp.get_pipe(name).model)).state_dict().items()
        }

    before = {name: weights(nlp, name) for name in ("textcat", "ner")}
    config = spacy.util.load_config(tmp_path / "replaced" / "config.cfg")
    for name in PIPES:
        config["components"][name] = {"source": str(tmp_path / "replaced")}
    config["paths"]["train"] = config["paths"]["dev"] = str(
        trained_dir.parent.parent / "train.spacy"
    )
    config["training"]["max_steps"] = 3
    config.to_disk(tmp_path / "resume.cfg")
    train(tmp_path / "resume.cfg", tmp_path / "resumed")
    resumed = spacy.load(tmp_path / "resumed" / "model-last")
    after = {name: weights(resumed, name) for name in ("textcat", "ner")}
    assert all(torch.equal(before["textcat"][k], after["textcat"][k]) for k in before["textcat"])
    assert any(not torch.equal(before["ner"][k], after["ner"][k]) for k in before["ner"])


def test_elmo_tok2vec_in_a_config_of_its_own(bilm_dir, tmp_path):
    """One pipe that owns its biLM, with no shared elmo pipe: its weights are
    in its own model's bytes before and after initialize."""
    nlp = spacy.blank("en")
    tok2vec = {
        "@architectures": "elmo_spacy.ElmoTok2Vec.v1",
        "bilm": {"@architectures": "elmo_spacy.ElmoBiLM.v1"},
        "mix": {"@architectures": "elmo_spacy.ScalarMix.v1"},
        "grad_factor": 1.0,
        "width": 8,
        "bilm_path": str(bilm_dir),
    }
    tagger = nlp.add_pipe(
        "tagger", config={"model": {"@architectures": "spacy.Tagger.v2", "tok2vec": tok2vec}}
    )
    # Before initialize: no biLM yet, and the bytes say so.
    config = {"model": nlp.config["components"]["tagger"]["model"]}
    empty = spacy.blank("en").add_pipe("tagger", config=config)
    empty.model.from_bytes(tagger.model.to_bytes())
    assert get_bilm(inline_bilm(empty.model)) is None
    train = [Example(d.copy(), d) for d in docs_with_annotations(nlp.vocab)]
    optimizer = nlp.initialize(lambda: train)
    for start in range(0, 16, 4):
        nlp.update(train[start : start + 4], sgd=optimizer)
    expected = [doc.to_array(["TAG"]) for doc in nlp.pipe(TEXTS)]
    nlp.to_disk(tmp_path / "own")
    loaded = spacy.load(
        tmp_path / "own",
        config={"components": {"tagger": {"model": {"tok2vec": {"bilm_path": None}}}}},
    )
    assert [doc.to_array(["TAG"]).tolist() for doc in loaded.pipe(TEXTS)] == [
        e.tolist() for e in expected
    ]
    # The model's bytes alone carry the biLM: a fresh, uninitialised copy reads them.
    fresh = spacy.blank("en").add_pipe("tagger", config=config)
    fresh.from_bytes(tagger.to_bytes())
    vectors = fresh.model.get_ref("tok2vec").predict([nlp.make_doc(TEXTS[0])])[0]
    own = tagger.model.get_ref("tok2vec").predict([nlp.make_doc(TEXTS[0])])[0]
    assert numpy.array_equal(vectors, own)


def test_an_elmo_tok2vec_without_a_biLM_says_what_to_set():
    nlp = spacy.blank("en")
    tok2vec = {
        "@architectures": "elmo_spacy.ElmoTok2Vec.v1",
        "bilm": {"@architectures": "elmo_spacy.ElmoBiLM.v1"},
        "mix": {"@architectures": "elmo_spacy.ScalarMix.v1"},
    }
    nlp.add_pipe(
        "tagger", config={"model": {"@architectures": "spacy.Tagger.v2", "tok2vec": tok2vec}}
    )
    doc = Doc(nlp.vocab, words=["A", "b"], tags=["DT", "NN"])
    with pytest.raises(ValueError, match="ElmoTok2Vec.v1 has no biLM.*bilm_path"):
        nlp.initialize(lambda: [Example(doc.copy(), doc)])
