"""AG News conversion: artefacts, bad rows, the dev split, the pretraining text."""

import pytest
import spacy
from spacy.tokens import DocBin

from scripts.agnews import (
    CLASS_NAMES,
    BadRowError,
    Row,
    clean_text,
    read_agnews_csv,
    stratified_split,
)
from scripts.agnews_corpus import build_corpus


@pytest.mark.parametrize(
    "raw,clean",
    [
        (
            "Wall Street's dwindling\\band of ultra-cynics",
            "Wall Street's dwindling band of ultra-cynics",
        ),
        ("costs #36;4.5 billion", "costs $4.5 billion"),
        ("the company#39;s shares", "the company's shares"),
        ("AT&amp;T and R&amp;D", "AT&T and R&D"),
        ("he said quot;no quot; today", 'he said "no " today'),
        ("&lt;b&gt;Update&lt;/b&gt; Markets", "Update Markets"),
        ("lt;b&gt;Bold lt;/b&gt; text", "Bold text"),
        ("&amp;lt;p&amp;gt;nested", "nested"),
        ("tabs\tand  spaces\\\\", "tabs and spaces"),
        ("#151; em dash", "\u2014 em dash"),
    ],
)
def test_clean_text_fixes_each_artefact(raw, clean):
    assert clean_text(raw) == clean


def write(tmp_path, content: bytes):
    path = tmp_path / "train.csv"
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    "content,reason",
    [
        (b'"1","a","b"\n"2","only two"\n', "train.csv:2: expected 3 columns"),
        (b'"1","a","b"\n"5","x","y"\n', "train.csv:2: unknown class '5'"),
        (b'"1","a","b"\n"2","caf\xe9","y"\n', "train.csv:2: bytes that are not UTF-8"),
        (b'"1","multi\nline","b"\n"2","","  "\n', "train.csv:3: empty title and description"),
    ],
)
def test_bad_rows_name_file_line_and_reason(tmp_path, content, reason):
    path = write(tmp_path, content)
    with pytest.raises(BadRowError, match=reason):
        list(read_agnews_csv(path))
    rows = list(read_agnews_csv(path, skip_bad_rows=True))
    assert len(rows) == 1 and rows[0].label == "World"


def test_title_and_description_both_go_in(tmp_path):
    path = write(tmp_path, b'"4","New chip (AP)","AP - A faster chip."\n"2","Win!","Team wins."\n')
    rows = list(read_agnews_csv(path))
    assert [r.text for r in rows] == ["New chip (AP). AP - A faster chip.", "Win! Team wins."]
    assert [r.label for r in rows] == ["Sci/Tech", "Sports"]


def test_stratified_split_is_seeded_and_keeps_class_shares():
    rows = [Row(CLASS_NAMES[i % 4], f"text {i}", i) for i in range(400)]
    train, dev = stratified_split(rows, 0.05, seed=1)
    assert len(dev) == 20 and len(train) == 380
    assert {c: sum(r.label == c for r in dev) for c in CLASS_NAMES} == dict.fromkeys(CLASS_NAMES, 5)
    assert stratified_split(rows, 0.05, seed=1) == (train, dev)
    assert stratified_split(rows, 0.05, seed=2)[1] != dev


def test_corpus_never_puts_dev_or_test_texts_in_pretraining(tmp_path):
    rows = "".join(f'"{i % 4 + 1}","title {i}","train text {i}"\n' for i in range(40))
    (tmp_path / "train.csv").write_text(rows)
    (tmp_path / "test.csv").write_text('"1","secret","test text"\n"2","other","test text 2"\n')
    (tmp_path / "unlabeled.txt").write_text("extra one\n\nextra two\n")
    stats = build_corpus(
        spacy.blank("en"),
        tmp_path / "train.csv",
        tmp_path / "out",
        test_csv=tmp_path / "test.csv",
        unlabeled=tmp_path / "unlabeled.txt",
        class_names=CLASS_NAMES,
        dev_fraction=0.2,
        seed=0,
    )
    assert stats["docs"] == {"train": 32, "dev": 8, "test": 2}
    pretrain = (tmp_path / "out" / "pretrain.txt").read_text().splitlines()
    nlp = spacy.blank("en")
    dev_texts = {
        d.text for d in DocBin().from_disk(tmp_path / "out" / "dev.spacy").get_docs(nlp.vocab)
    }
    assert len(pretrain) == 34 and "extra two" in pretrain
    assert not dev_texts & set(pretrain)
    assert not any("test text" in t for t in pretrain)
    test_docs = list(DocBin().from_disk(tmp_path / "out" / "test.spacy").get_docs(nlp.vocab))
    assert test_docs[0].cats == {"World": 1.0, "Sports": 0.0, "Business": 0.0, "Sci/Tech": 0.0}
