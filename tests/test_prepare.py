"""`elmo-spacy prepare`: text tokenised once into a prepared corpus, read back
exactly, resumed after a crash, prepared in parts, and refused when bad."""

import gzip
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy
import pytest

import elmo_spacy.pretrain.corpus as corpus_module
import elmo_spacy.pretrain.prepare as prepare_module
from elmo_spacy.bilm import WordVocab
from elmo_spacy.pretrain import Corpus, prepare_corpus, prepare_docs
from elmo_spacy.pretrain.batches import corpus_vocabulary
from elmo_spacy.pretrain.corpus import MANIFEST, CorpusDamaged

from .conftest import CONFIGS, DATA, ELMO_SPACY, cli, tokenize

TEXTS = [t for t in (DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines() if t.strip()]


def docs_of(corpus: Corpus) -> list[list[str]]:
    """Every doc of the corpus as token strings, in order."""
    docs = []
    for number, shard in enumerate(corpus.shards):
        for start, stop in zip(shard.docs[:-1], shard.docs[1:]):
            ids = corpus.tokens(number, int(start), int(stop - start))
            docs.append(corpus.types.strings_of(ids))
    return docs


def counts_of(corpus: Corpus) -> dict[str, int]:
    return dict(
        zip(corpus.types.strings_of(range(len(corpus.types))), corpus.types.counts.tolist())
    )


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def test_the_ids_give_back_spacys_tokens_of_each_line(tmp_path, text):
    prepare_corpus([text], tmp_path / "corpus", show_progress=False)
    corpus = Corpus.open([tmp_path / "corpus"])
    assert docs_of(corpus) == tokenize(TEXTS)
    assert corpus.n_docs == len(TEXTS) and corpus.n_tokens == sum(map(len, tokenize(TEXTS)))
    assert sum(counts_of(corpus).values()) == corpus.n_tokens
    manifest = json.loads((tmp_path / "corpus" / MANIFEST).read_text())
    assert manifest["tokenization"] == {"tokenizer": "spacy", "lang": "en"}
    assert manifest["sources"][0]["bytes"] == text.stat().st_size
    assert manifest["sources"][0]["sha256"] == hashlib.sha256(text.read_bytes()).hexdigest()


def test_pretokenized_text_jsonl_gzip_folders_and_globs_are_read_alike(tmp_path):
    lines = ["a  b\tc", "", "naïve  café ", "x"]
    source = tmp_path / "in"
    (source / "sub").mkdir(parents=True)
    (source / "one.txt").write_text("\n".join(lines[:2]) + "\n", encoding="utf-8")
    with gzip.open(source / "sub" / "two.jsonl.gz", "wt", encoding="utf-8") as file:
        for line in lines[2:]:
            file.write(json.dumps({"text": line, "id": 1}) + "\n")
    (source / "notes.md").write_text("not text to train on", encoding="utf-8")
    for inputs in ([source], [str(source / "*.txt"), str(source / "**" / "*.gz")]):
        output = tmp_path / "corpus"
        prepare_corpus(inputs, output, pretokenized=True, overwrite=True, show_progress=False)
        corpus = Corpus.open([output])
        assert docs_of(corpus) == [["a", "b", "c"], ["naïve", "café"], ["x"]]
        assert str(corpus.tokenization) == "white space"


@pytest.mark.slow  # two processes of their own (7 s)
def test_two_processes_prepare_what_one_does(tmp_path, text):
    prepare_corpus([text], tmp_path / "one", shard_size=2000, show_progress=False)
    prepare_corpus([text], tmp_path / "two", shard_size=2000, n_process=2, show_progress=False)
    one, two = (Corpus.open([tmp_path / name]) for name in ("one", "two"))
    assert docs_of(one) == docs_of(two) and counts_of(one) == counts_of(two)
    assert one.fingerprint == two.fingerprint


class Killed(Exception):
    pass


def test_a_preparation_stopped_midway_goes_on_to_what_an_uninterrupted_one_writes(
    tmp_path, text, monkeypatch
):
    prepare_corpus([text], tmp_path / "whole", shard_size=1500, show_progress=False)
    real_finish = corpus_module._ShardFile.finish
    finished = []

    def finish_then_die(shard, added):
        if len(finished) == 2:  # in the middle of the third shard
            raise Killed
        finished.append(shard.index)
        return real_finish(shard, added)

    monkeypatch.setattr(corpus_module._ShardFile, "finish", finish_then_die)
    with pytest.raises(Killed):
        prepare_corpus([text], tmp_path / "resumed", shard_size=1500, show_progress=False)
    assert not (tmp_path / "resumed" / MANIFEST).exists()
    with pytest.raises(ValueError, match="has not finished.*run the same"):
        Corpus.open([tmp_path / "resumed"])
    monkeypatch.setattr(corpus_module._ShardFile, "finish", real_finish)
    tokenised = []
    real_tokenize = prepare_module.tokenize_texts
    monkeypatch.setattr(
        prepare_module,
        "tokenize_texts",
        lambda texts: tokenised.append(texts) or real_tokenize(texts),
    )
    prepare_corpus([text], tmp_path / "resumed", shard_size=1500, show_progress=False)
    assert TEXTS[0] not in [t for task in tokenised for t in task]  # shard 0 was not redone
    assert folder_bytes(tmp_path / "resumed") == folder_bytes(tmp_path / "whole")


@pytest.mark.slow  # over 10 s: make test-slow
def test_prepare_killed_by_sigkill_then_run_again_writes_the_uninterrupted_corpus(tmp_path):
    text = tmp_path / "big.txt"
    text.write_text("\n".join(TEXTS * 400) + "\n", encoding="utf-8")
    command = [ELMO_SPACY, "prepare", str(text), "--shard-size", "50k"]
    assert subprocess.run([*command, str(tmp_path / "whole")], capture_output=True).returncode == 0
    process = subprocess.Popen([*command, str(tmp_path / "killed")], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "killed").glob("shard-00002")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "killed" / MANIFEST).exists(), "it finished before it was killed"
    done = subprocess.run([*command, str(tmp_path / "killed")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert folder_bytes(tmp_path / "killed") == folder_bytes(tmp_path / "whole")


def test_parts_prepared_apart_read_together_as_the_whole(tmp_path, text):
    prepare_corpus([text], tmp_path / "whole", shard_size=800, show_progress=False)
    for k in range(3):
        prepare_corpus(
            [text], tmp_path / f"part-{k}", shard_size=800, part=(k, 3), show_progress=False
        )
    whole = Corpus.open([tmp_path / "whole"])
    parts = Corpus.open([tmp_path / f"part-{k}" for k in (2, 0, 1)])  # any order
    assert len(parts.shards) == len(whole.shards) > 3
    assert docs_of(parts) == docs_of(whole)
    assert counts_of(parts) == counts_of(whole)
    vocab = [corpus_vocabulary(c.types, 500, 2) for c in (whole, parts)]
    assert vocab[0] == vocab[1]
    with pytest.warns(UserWarning, match="shards of its preparation"):
        Corpus.open([tmp_path / "part-0", tmp_path / "part-1"])
    with pytest.raises(ValueError, match="the same shard"):
        Corpus.open([tmp_path / "part-0", tmp_path / "part-0"])


def test_the_vocabulary_of_the_type_counts_is_word_vocab_builds(tmp_path, text):
    prepare_corpus([text], tmp_path / "corpus", show_progress=False)
    types = Corpus.open([tmp_path / "corpus"]).types
    for max_size, min_count in ((50, 1), (300, 2), (10**6, 1)):
        assert corpus_vocabulary(types, max_size, min_count) == WordVocab.build(
            tokenize(TEXTS), max_size=max_size, min_count=min_count
        )


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("latin.txt", "ok\ncafé\n".encode("latin-1"), "latin.txt:2:4: not valid UTF-8: byte 0xe9"),
        ("empty.txt", b"\n \n", "empty.txt: no text: the file is empty"),
        (
            "bad.jsonl",
            b'{"text": "fine"}\n{"txt": "no"}\n',
            "bad.jsonl:2: expected a JSON object with a \"text\" field, found keys ['txt']",
        ),
        (
            "list.jsonl",
            b'["text"]\n',
            'list.jsonl:1: expected a JSON object with a "text" field, found list',
        ),
        ("cut.jsonl", b'{"text": "a}\n', "cut.jsonl:1: not JSON (Invalid control character"),
        ("num.jsonl", b'{"text": 3}\n', 'num.jsonl:1: "text" is of type int, not a string'),
        (
            "cut.txt.gz",
            gzip.compress(b"some text\n" * 100, mtime=0)[:-30],
            "cut.txt.gz: not a readable gzip file",
        ),
        (
            "latin.txt.gz",
            gzip.compress(b"ok\n\xff\n", mtime=0),
            "latin.txt.gz:2:1: not valid UTF-8: byte 0xff",
        ),
    ],
)
def test_bad_input_is_named_by_file_and_line_and_leaves_nothing(tmp_path, name, content, message):
    (tmp_path / "good.txt").write_text("Good text first.\n", encoding="utf-8")
    (tmp_path / name).write_bytes(content)
    result = cli("prepare", tmp_path / "good.txt", tmp_path / name, tmp_path / "corpus")
    assert result.returncode == 1
    assert message in " ".join(result.stderr.split())
    assert result.stderr.splitlines()[-1].startswith(str(tmp_path / name))  # not after the bar
    assert not (tmp_path / "corpus").exists()


def test_missing_inputs_and_foreign_folders_are_refused(tmp_path, text):
    result = cli("prepare", tmp_path / "nope.txt", tmp_path / "corpus")
    assert result.returncode == 1 and "nope.txt: no such text file or folder" in result.stderr
    result = cli("prepare", str(tmp_path / "*.jsonl"), tmp_path / "corpus")
    assert result.returncode == 1 and "no file matches this pattern" in result.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep", encoding="utf-8")
    result = cli("prepare", text, tmp_path / "mine")
    assert result.returncode == 1 and "notes.txt" in result.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text(encoding="utf-8") == "keep"
    result = cli("prepare", text, tmp_path / "corpus", "--lang", "qq")
    assert result.returncode == 1 and "--lang qq: spaCy has no such language" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "corpus").exists()
    assert cli("prepare", text, tmp_path / "corpus").returncode == 0
    result = cli(
        "pretrain",
        CONFIGS / "bilm_tiny.cfg",
        tmp_path / "corpus",
        tmp_path / "nope",
        tmp_path / "out",
    )
    assert (
        result.returncode == 1 and f"{tmp_path / 'nope'}: no such file or folder" in result.stderr
    )
    result = cli("pretrain", CONFIGS / "bilm_tiny.cfg", text, tmp_path / "out", "--lang", "qq")
    assert result.returncode == 1 and "--lang qq: spaCy has no such language" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_finished_preparation_is_kept_and_other_inputs_need_overwrite(tmp_path, text):
    result = cli("prepare", text, tmp_path / "corpus", "--shard-size", "2k")
    assert result.returncode == 0, result.stderr
    assert f"{len(TEXTS):,} docs" in result.stdout and "shard(s)" in result.stdout
    before = folder_bytes(tmp_path / "corpus")
    assert cli("prepare", text, tmp_path / "corpus", "--shard-size", "2k").returncode == 0
    assert folder_bytes(tmp_path / "corpus") == before  # nothing to do
    result = cli("prepare", text, tmp_path / "corpus", "--pretokenized")
    assert result.returncode == 1 and "--overwrite" in result.stderr
    result = cli("prepare", text, tmp_path / "corpus", "--pretokenized", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert str(Corpus.open([tmp_path / "corpus"]).tokenization) == "white space"


def test_prepare_docs_again_keeps_the_same_docs_and_replaces_others(tmp_path):
    first, other = [["a", "b"], ["c"]], [["a", "b"], ["d"]]
    folder = prepare_docs(first, tmp_path / "corpus")
    before = folder_bytes(folder)
    assert prepare_docs(iter(first), folder) == folder
    assert folder_bytes(folder) == before  # the same docs: nothing to do
    prepare_docs(other, folder)
    corpus = Corpus.open([folder])
    assert corpus.types.strings_of(corpus.tokens(0, 0, corpus.n_tokens)) == ["a", "b", "d"]


def test_a_corpus_changed_on_disk_is_refused_when_opened(tmp_path, text):
    prepare_corpus([text], tmp_path / "corpus", show_progress=False)
    tokens = tmp_path / "corpus" / "shard-00000" / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-4])
    with pytest.raises(ValueError, match="tokens.bin holds .* truncated or replaced"):
        Corpus.open([tmp_path / "corpus"])
    with pytest.raises(ValueError, match="not a prepared corpus.*elmo-spacy prepare"):
        Corpus.open([tmp_path])


def test_folders_tokenised_differently_are_not_one_corpus(tmp_path, text):
    prepare_corpus([text], tmp_path / "spacy", show_progress=False)
    prepare_corpus([text], tmp_path / "split", pretokenized=True, show_progress=False)
    with pytest.raises(ValueError, match="tokenised in different ways"):
        Corpus.open([tmp_path / "spacy", tmp_path / "split"])


def _damage(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(data)


def _pretrain_on(corpus: Path, output: Path):
    from elmo_spacy.pretrain import PretrainConfig, pretrain

    from .conftest import TINY_BILM

    settings = PretrainConfig(max_epochs=1, batch_tokens=600, patience=0, dev_fraction=0.0)
    return pretrain(Corpus.open([corpus]), TINY_BILM, settings, output, show_progress=False)


def test_ids_out_of_range_stop_pretraining_naming_the_shard(tmp_path, text):
    prepare_corpus([text], tmp_path / "corpus", show_progress=False)
    tokens = tmp_path / "corpus" / "shard-00000" / "tokens.bin"
    _damage(tokens, 400, b"\xff" * 4096)  # ids -1
    with pytest.raises(CorpusDamaged, match=rf"{tokens} holds token ids outside its type table"):
        _pretrain_on(tmp_path / "corpus", tmp_path / "bilm")
    assert not (tmp_path / "bilm" / "model-best").exists()


def test_valid_ids_written_over_stop_pretraining_before_anything_is_saved(tmp_path, text):
    prepare_corpus([text], tmp_path / "corpus", show_progress=False)
    tokens = tmp_path / "corpus" / "shard-00000" / "tokens.bin"
    ids = numpy.fromfile(tokens, dtype="<i4")
    ids[100:1100] = ids[1100:2100]  # 1,000 ids: each a type of the table
    ids.tofile(tokens)
    with pytest.raises(CorpusDamaged, match=rf"{tokens} does not hold what its manifest"):
        _pretrain_on(tmp_path / "corpus", tmp_path / "bilm")
    assert not (tmp_path / "bilm" / "model-best").exists()
    assert not list((tmp_path / "bilm").glob("checkpoint-*"))
    result = cli("prepare", "--verify", tmp_path / "corpus")
    assert result.returncode == 1 and f"{tokens} does not hold what" in result.stderr


def test_verify_passes_a_whole_corpus_and_part_names_a_part(tmp_path, text):
    prepare_corpus([text], tmp_path / "corpus", show_progress=False)
    result = cli("prepare", "--verify", tmp_path / "corpus")
    assert result.returncode == 0 and "every file as its manifest says" in result.stdout
    result = cli("prepare", text, tmp_path / "part", "--part", "1/2", "--shard-size", "2k")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "part" / MANIFEST).read_text())
    assert manifest["part"] == [1, 2]
