"""Silent wrong runs: each stops before any work, naming the file and what to do."""

import importlib.util

import pytest
import spacy
from spacy.training import Example

from elmo_spacy.bilm import BiLM, WordVocab
from elmo_spacy.bilm.formats.exported import export_bilm
from elmo_spacy.pretrain import load_pretrain_config

from .conftest import CONFIGS, TINY_BILM, cli


def test_no_biLM_path_is_refused_and_untrained_must_be_asked_for(corpus_dir):
    nlp = spacy.blank("en")
    elmo = nlp.add_pipe("elmo", config={"model": {"bilm": {"projection_dim": 8, "lstm_dim": 16}}})
    with pytest.raises(ValueError, match="bilm_path"):
        nlp.initialize()
    with pytest.warns(UserWarning, match="untrained"):
        elmo.initialize(lambda: [Example.from_dict(nlp.make_doc("a b c"), {})], untrained=True)
    assert nlp("Hello there")._.elmo.shape == (3, 2, 16)


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("--training.max_epochs", "two", "max_epochs = 'two': a number"),
        ("--training.max_epochs", "0", "max_epochs = 0: at least 1"),
        ("--bilm.lstm_dim", "-3", "lstm_dim = -3: at least 1"),
        ("--bilm.lstm_dim", "big", "lstm_dim = 'big': a whole number"),
        ("--bilm.projection_dim", "1.5", "projection_dim = 1.5: a whole number"),
        ("--bilm.filters", "3", "filters = 3: a list of [width, count] pairs"),
        ("--bilm.skip_connections", "yes", "skip_connections = 'yes': true or false"),
    ],
)
def test_a_bad_pretraining_value_stops_before_work(tmp_path, corpus_dir, setting, value, message):
    result = cli(
        "pretrain",
        str(CONFIGS / "bilm_tiny.cfg"),
        str(corpus_dir / "pretrain.txt"),
        str(tmp_path / "out"),
        setting,
        value,
    )
    assert result.returncode == 1
    assert message in " ".join(result.stderr.split())
    assert "bilm_tiny.cfg" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_config_that_is_not_utf8_is_named(tmp_path, corpus_dir):
    text = (CONFIGS / "bilm_tiny.cfg").read_text(encoding="utf-8")
    (tmp_path / "utf16.cfg").write_text(text, encoding="utf-16")
    result = cli(
        "pretrain",
        str(tmp_path / "utf16.cfg"),
        str(corpus_dir / "pretrain.txt"),
        str(tmp_path / "out"),
    )
    assert result.returncode == 1
    assert "utf16.cfg" in result.stderr and "UTF-8" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "edit, message",
    [
        (("[training]", "[training"), "bad.cfg:18: cannot read '[training': sections are [name]"),
        (("max_epochs = 2", "max_epochs 2"), "bad.cfg:25: cannot read 'max_epochs 2'"),
        (("seed = 0", "seed = 0\nseed = 1"), "bad.cfg:20: [training] sets seed a second time"),
        (("[training]", "[bilm]"), "bad.cfg:18: a second [bilm] section"),
        (("[bilm]", "junk\n[bilm]"), "bad.cfg:3: 'junk' comes before any [section]"),
    ],
)
def test_a_pretraining_config_syntax_error_names_the_file_and_line(tmp_path, edit, message):
    text = (CONFIGS / "bilm_tiny.cfg").read_text(encoding="utf-8")
    assert text.splitlines()[17] == "[training]" and text.splitlines()[24] == "max_epochs = 2"
    (tmp_path / "bad.cfg").write_text(text.replace(*edit, 1), encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        load_pretrain_config(tmp_path / "bad.cfg")
    assert str(refused.value).startswith(f"{tmp_path / message}")
    assert "<string>" not in str(refused.value)


def test_exporting_onnx_without_onnx_installed_says_which_extra_to_install(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "onnxscript" else find_spec(name, *a),
    )
    bilm = BiLM(
        TINY_BILM, WordVocab.build([["a", "b"]], max_size=10, min_count=1), with_softmax=False
    )
    with pytest.raises(
        ValueError, match=r"needs (onnx and )?onnxscript.*pip install 'elmo_spacy\[export\]'"
    ):
        export_bilm(bilm, tmp_path, formats=["onnx"])
    assert not list(tmp_path.iterdir())
