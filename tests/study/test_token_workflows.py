"""The token-level workflows: CoNLL-2003 and CoNLL-U converters, and a smoke run
of the ner and tag workflows on made-up fixture files (tests/data)."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import spacy
from spacy.tokens import DocBin

from scripts.conll import ConllFormatError, read_conll2003, read_conllu
from scripts.token_corpus import build_token_corpus
from scripts.token_evaluate import most_confused

from ..conftest import DATA
from .conftest import run, run_workflow

VOCAB = spacy.blank("en").vocab


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_conll2003_documents_sentences_and_iob1_entities(tmp_path):
    text = (
        "EU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\ncall NN I-NP O\n\n"
        "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\nJohn NNP I-NP B-PER\n\n"
        "-DOCSTART- -X- O O\n\n"
        "Rome NNP I-NP I-LOC\nwins VBZ I-VP O\n\n"
        "-DOCSTART- -X- O O\n"
    )
    docs = list(read_conll2003(write(tmp_path / "eng.train", text), VOCAB))
    assert len(docs) == 2
    first = docs[0]
    assert [s.text for s in first.sents] == ["EU rejects German call", "Peter Blackburn John"]
    assert [(e.text, e.label_) for e in first.ents] == [
        ("EU", "ORG"),
        ("German", "MISC"),
        ("Peter Blackburn", "PER"),
        ("John", "PER"),  # B- starts a new entity of the same type (IOB1)
    ]
    assert [(e.text, e.label_) for e in docs[1].ents] == [("Rome", "LOC")]
    # -DOCSTART- at each document's start, as in the original files: the same docs.
    starts_first = (
        "-DOCSTART- -X- O O\n\n"
        "EU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\ncall NN I-NP O\n\n"
        "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\nJohn NNP I-NP B-PER\n\n"
        "-DOCSTART- -X- O O\n\n"
        "Rome NNP I-NP I-LOC\nwins VBZ I-VP O\n"
    )
    again = list(read_conll2003(write(tmp_path / "starts.txt", starts_first), VOCAB))
    assert [d.text for d in again] == [d.text for d in docs]


def test_conll2003_bad_line_names_file_and_line(tmp_path):
    path = write(tmp_path / "eng.train", "EU NNP I-NP I-ORG\nrejects VBZ I-VP X-BAD\n")
    with pytest.raises(ConllFormatError, match=r"eng.train:2: expected"):
        list(read_conll2003(path, VOCAB))


def test_conllu_words_upos_and_xpos():
    docs = list(read_conllu(DATA / "ud_ewt" / "en_ewt-ud-dev.conllu", VOCAB, n_sents=10))
    first = docs[0]
    assert len(list(first.sents)) == 10
    # the multi-word token "can't" becomes its words "ca" + "n't"
    assert [(t.text, t.pos_, t.tag_) for t in first[:2]] == [
        ("ca", "AUX", "MD"),
        ("n't", "PART", "RB"),
    ]
    assert all(t.pos_ and t.tag_ for doc in docs for t in doc)


def test_corpus_keeps_dev_text_out_of_pretraining_and_checks_md5(tmp_path):
    source = DATA / "conll2003"
    stats = build_token_corpus(
        "ner", source, tmp_path / "out", DATA / "unlabeled.txt", verify=False
    )
    assert not stats["has_test"] and stats["train"]["entities"] > 100
    pretrain = (tmp_path / "out" / "pretrain.txt").read_text(encoding="utf-8").splitlines()
    dev = list(DocBin().from_disk(tmp_path / "out" / "dev.spacy").get_docs(VOCAB))
    assert not {doc.text for doc in dev} & set(pretrain)
    assert pretrain[0] == (DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[0]
    with pytest.raises(ValueError, match=r"eng.train: md5 is [0-9a-f]{32}, expected e9ad8146"):
        build_token_corpus("ner", source, tmp_path / "again", verify=True, log=lambda _: None)


def test_a_missing_split_is_named(tmp_path):
    (tmp_path / "conll").mkdir()
    shutil.copy(DATA / "conll2003" / "eng.train", tmp_path / "conll")
    result = run(
        "scripts", "ner-corpus", str(tmp_path / "conll"), str(tmp_path / "out"), "--no-verify"
    )
    assert result.returncode == 1 and "eng.testa is missing" in result.stderr


@pytest.mark.slow  # the whole smoke-tokens workflow, ~20 processes: make test-slow
def test_token_workflows_smoke_run(tmp_path):
    env_path = f"{Path(sys.executable).parent}"
    env = {"PATH": f"{env_path}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = run_workflow(tmp_path, "smoke-tokens", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for task, keys in (
        ("ner", ("ents_f", "ents_p", "ents_r", "ents_per_type")),
        ("tag", ("pos_acc", "tag_acc")),
    ):
        for run_name in ("cnn", "static", "elmo"):
            metrics = json.loads((tmp_path / f"metrics/smoke/{task}_{run_name}.json").read_text())
            assert "test" not in metrics and metrics["train_seconds"] > 0
            assert all(key in metrics["dev"] for key in keys)
            assert metrics["dev"]["words_per_second"] > 0
        table = (tmp_path / f"metrics/smoke/{task}.md").read_text()
        assert "every figure is on dev" in table and "| elmo |" in table
    adapted = json.loads(
        (tmp_path / "training/smoke/ner/bilm-adapted/pretrain_log.json").read_text()
    )
    assert adapted["init_dev_perplexity"]["mean"] > 1 and len(adapted["epochs"]) == 1
    # A picture of the confused UPOS tags for each tagger that confused any
    for run_name in ("cnn", "static", "elmo"):
        metrics = json.loads((tmp_path / f"metrics/smoke/tag_{run_name}.json").read_text())
        picture = tmp_path / f"metrics/smoke/tag_{run_name}_dev_pos_confusion.png"
        assert picture.is_file() == bool(most_confused(metrics["dev"]["pos_confusion"]))
