"""Every shipped downstream config trains unchanged with a biLM of any width:
here the plugin's examples; the study's textcat configs are trained so by
tests/study/test_textcat_configs.py."""

from pathlib import Path

import pytest
import spacy
from spacy.cli.train import train
from spacy.tokens import Doc, DocBin

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab, save_bilm
from elmo_spacy.bilm.formats.bilm_tf import read_bilm_tf
from elmo_spacy.bilm.inputs.vocab import SPECIALS

from .conftest import CONFIGS
from .test_elmo_format import FIXTURES, needs_fixtures

LISTENING_CONFIGS = ["ner_elmo", "tag_elmo"]
WORDS = ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]
TAGS = ["NNP", "VBZ", "JJ", "NN", "TO", "VB", "JJ", "NN", "."]
POS = ["PROPN", "VERB", "ADJ", "NOUN", "PART", "VERB", "ADJ", "NOUN", "PUNCT"]
ENTS = ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]


def random_bilm(projection_dim: int) -> BiLM:
    """A char-CNN biLM of random weights whose layers are 2 x projection_dim wide."""
    config = BiLMConfig(
        max_chars=20,
        char_dim=4,
        filters=[(1, 8), (2, 8)],
        projection_dim=projection_dim,
        lstm_dim=2 * projection_dim,
        n_layers=2,
        dropout=0.0,
        cutoffs=[],
        min_count=1,
    )
    return BiLM(config, WordVocab([*SPECIALS, *WORDS]), with_softmax=False)


@pytest.fixture(scope="module", params=["32", "1024", "reference fixture"])
def any_bilm(request, tmp_path_factory) -> tuple[Path, int]:
    """A biLM directory and the width of its layers."""
    if request.param == "reference fixture":
        if not (FIXTURES / "lm_weights.hdf5").is_file():
            pytest.skip(needs_fixtures.kwargs["reason"])
        bilm = read_bilm_tf(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    else:
        bilm = random_bilm(int(request.param) // 2)
    path = save_bilm(bilm, tmp_path_factory.mktemp("bilm") / "bilm")
    return path, 2 * bilm.config.projection_dim


@pytest.fixture(scope="module")
def token_corpus(tmp_path_factory) -> Path:
    """train.spacy (= dev.spacy) of a few sentences with entities, tags, UPOS
    and one of two topics."""
    nlp = spacy.blank("en")
    docs = [
        Doc(nlp.vocab, words=WORDS, tags=TAGS, pos=POS, ents=ENTS, sent_starts=[True] + [False] * 8)
        for _ in range(4)
    ]
    for i, doc in enumerate(docs):
        doc.cats = {"World": float(i % 2 == 0), "Business": float(i % 2 == 1)}
    path = tmp_path_factory.mktemp("tokens") / "train.spacy"
    DocBin(docs=docs, store_user_data=True).to_disk(path)
    return path


@pytest.mark.parametrize("name", LISTENING_CONFIGS)
def test_the_config_trains_with_a_bilm_of_any_width(name, any_bilm, token_corpus, tmp_path):
    train_with_any_width(name, any_bilm, token_corpus, tmp_path)


def train_with_any_width(name, any_bilm, token_corpus, tmp_path, overrides=None):
    """configs/NAME.cfg trained two steps with the biLM of `any_bilm`: every
    token of the trained pipeline gets layers as wide as the biLM's."""
    bilm_path, width = any_bilm
    overrides = {
        "paths.bilm": str(bilm_path),
        "paths.train": str(token_corpus),
        "paths.dev": str(token_corpus),
        "training.max_steps": 2,
        "training.eval_frequency": 1,
        **(overrides or {}),
    }
    train(CONFIGS / f"{name}.cfg", tmp_path / "out", overrides=overrides)

    nlp = spacy.load(tmp_path / "out" / "model-last")
    doc = nlp(" ".join(WORDS))
    assert doc._.elmo.shape[1:] == (len(doc), width)


def test_the_listener_projects_the_mix_to_its_width(bilm_dir):
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    nlp.get_pipe("elmo").initialize(lambda: [], nlp=nlp, bilm_path=bilm_dir)
    listener = spacy.registry.resolve(
        {
            "model": {
                "@architectures": "elmo_spacy.ElmoListener.v1",
                "upstream": "elmo",
                "width": 12,
                "mix": {"@architectures": "elmo_spacy.ScalarMix.v1"},
            }
        }
    )["model"]
    assert listener.get_dim("nO") == 12  # known before initialisation, as spaCy needs
    docs = list(nlp.pipe(["EU rejects German call .", "British lamb"]))
    listener.initialize(X=docs)
    outputs, backprop = listener.begin_update(docs)
    assert [o.shape for o in outputs] == [(5, 12), (2, 12)]
    backprop([o * 0 + 1 for o in outputs])
    projection = listener.get_ref("projection")
    assert projection.get_dim("nI") == docs[0]._.elmo.shape[2]
    assert abs(projection.get_grad("W")).sum() > 0
