"""precision = "float16", for GPUs without bfloat16: the setting, where it
falls back to float32, and the loss scaling of training. On the CPU float16
runs as float32; the tests that train in it make the CPU run it (torch
computes float16 there, slowly)."""

import json
import warnings

import pytest
import spacy
import torch
from safetensors.torch import load_file

import elmo_spacy.bilm.runtime.precision as precision_module
from elmo_spacy.bilm import BiLMConfig
from elmo_spacy.bilm.runtime.precision import resolve_precision
from elmo_spacy.layers import get_bilm, get_runner
from elmo_spacy.pretrain import PretrainConfig, pretrain
from elmo_spacy.pretrain.run_folder import RunFolder

from .conftest import SCALAR_MIX, TINY_BILM, corpus_of, examples, make_nlp
from .test_precision import CLIPPED, DOCS

FALLS_BACK = r"precision = 'float16' runs as 'float32': float16 is for GPUs without bfloat16"


@pytest.fixture
def float16_runs_here(monkeypatch):
    monkeypatch.setattr(precision_module, "float16_unsupported", lambda device="cpu": None)


def test_float16_on_the_cpu_says_it_runs_float32_and_keeps_the_setting(bilm_dir, tmp_path):
    nlp = spacy.blank("en")
    elmo = nlp.add_pipe("elmo", config={"model": {"run": {"precision": "float16"}}})
    with pytest.warns(RuntimeWarning, match=r"run." + FALLS_BACK):
        elmo.initialize(lambda: [], bilm_path=bilm_dir)
    assert get_bilm(elmo.model).precision == "float32"
    nlp.to_disk(tmp_path / "nlp")
    with pytest.warns(RuntimeWarning, match=FALLS_BACK):
        loaded = spacy.load(tmp_path / "nlp")
    assert get_runner(loaded.get_pipe("elmo").model).settings.precision == "float16"
    assert loaded.config["components"]["elmo"]["model"]["run"]["precision"] == "float16"
    settings = PretrainConfig(max_epochs=1, batch_tokens=600, patience=0, precision="float16")
    with pytest.warns(RuntimeWarning, match=r"\[training\] " + FALLS_BACK):
        log = pretrain(corpus_of(DOCS), TINY_BILM, settings, tmp_path / "bilm")
    assert log["precision"] == "float32"


def test_bfloat16_on_a_gpu_without_it_points_to_float16(monkeypatch):
    reason = "Tesla T4 has no native bfloat16"
    monkeypatch.setattr(precision_module, "bfloat16_unsupported", lambda device="cpu": reason)
    with pytest.warns(RuntimeWarning, match="float16' is the fast path on this GPU"):
        assert resolve_precision("bfloat16", "cuda") == "float32"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_precision("float16", "cuda") == "float16"


def test_pretraining_in_float16_scales_the_loss_and_keeps_its_scale(float16_runs_here, tmp_path):
    config = BiLMConfig(**{**TINY_BILM.to_dict(), **CLIPPED})
    settings = PretrainConfig(
        max_epochs=2,
        batch_tokens=600,
        learning_rate=0.005,
        patience=0,
        checkpoint_every=3,
        dev_fraction=0.0,
        precision="float16",
    )
    log = pretrain(corpus_of(DOCS), config, settings, tmp_path, show_progress=False)
    assert log["precision"] == "float16"
    dev = [epoch["dev_perplexity"]["mean"] for epoch in log["epochs"]]
    assert dev[1] < dev[0]
    weights = load_file(str(tmp_path / "model-last" / "weights.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.float32}
    progress = json.loads((RunFolder(tmp_path).latest_checkpoint() / "progress.json").read_text())
    assert progress["progress"]["loss_scale"]["scale"] > 0  # the GradScaler's, to resume with


def test_fine_tuning_in_float16_moves_the_weights(float16_runs_here, bilm_dir, corpus_dir):
    """(The loss scaler is thinc's, which runs on a GPU only: test_gpu.py.)"""
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0, elmo_model={"run": {"precision": "float16"}})
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    bilm = get_bilm(nlp.get_pipe("elmo").model)
    assert bilm.precision == "float16"
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    for start in range(0, 24, 8):  # the third update moves the biLM (test_pipe_settings)
        nlp.update(train[start : start + 8], sgd=optimizer)
    after = bilm.state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert moved and all(torch.isfinite(after[k]).all() for k in moved)
