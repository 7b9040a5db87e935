"""Every path on a GPU. Arrays cross between the host and the device only
through the models' ops (checked here on the CPU, with ops whose arrays stand
for a device's); the runs on CUDA themselves are marked `gpu` and skip, saying
why, where torch sees no CUDA GPU (CI has none): `make test-gpu` runs them."""

import contextlib
import json

import h5py
import numpy
import pytest
import spacy
import torch
from spacy.cli.train import train
from thinc.api import NumpyOps

import elmo_spacy.pipeline
from elmo_spacy import Embedder
from elmo_spacy.bilm import BiLM, BiLMConfig, load_bilm
from elmo_spacy.layers import get_bilm

from . import test_any_width
from .conftest import CONFIGS, DATA, SCALAR_MIX, TINY_BILM, examples, make_nlp, run, tokenize
from .kernels import forced_kernel
from .test_elmo_format import (
    FIXTURES,
    TOLERANCE,
    max_difference,
    needs_fixtures,
    reference_batches,
)


class OnDevice(numpy.ndarray):
    """An array that stands for one in a GPU's memory (a cupy array): the
    ops below make one of every array they allocate or take in, and only
    their `to_numpy` gives a plain numpy array back."""


class DeviceOps(NumpyOps):
    name = "device-stand-in"

    def alloc(self, shape, *, dtype="float32", zeros=True):
        return super().alloc(shape, dtype=dtype, zeros=zeros).view(OnDevice)

    def asarray(self, data, *, dtype=None):
        return numpy.asarray(data, dtype=dtype).view(OnDevice)

    def to_numpy(self, data, *, byte_order=None):
        return numpy.asarray(data).view(numpy.ndarray)


def on_device_ops(nlp):
    for name in nlp.pipe_names:
        for node in nlp.get_pipe(name).model.walk():
            node.ops = DeviceOps()
    return nlp


@pytest.fixture(scope="module")
def device_nlp(bilm_dir, corpus_dir):
    """A frozen-biLM pipeline on DeviceOps, never trained before its tests."""
    nlp = make_nlp(bilm_dir, SCALAR_MIX, grad_factor=0.0)
    train = examples(nlp, corpus_dir / "train.spacy")[:8]
    nlp.initialize(lambda: train)
    return on_device_ops(nlp), train


def test_docs_get_host_arrays_from_a_model_on_a_device(device_nlp, monkeypatch):
    nlp, _ = device_nlp
    given = []
    annotate = elmo_spacy.pipeline.annotate
    monkeypatch.setattr(
        elmo_spacy.pipeline,
        "annotate",
        lambda doc, layers, *args: given.append(type(layers)) or annotate(doc, layers, *args),
    )
    doc = nlp("Stocks rallied after the central bank cut rates.")
    assert given == [numpy.ndarray]
    assert doc._.elmo.shape[1] == len(doc) and sum(doc.cats.values()) == pytest.approx(1.0)


def test_listeners_get_device_arrays_from_host_docs(device_nlp):
    nlp, _ = device_nlp
    docs = list(nlp.get_pipe("elmo").pipe(nlp.make_doc(t) for t in ("One doc .", "And two .")))
    assert all(type(doc._.elmo) is not OnDevice for doc in docs)
    listener = nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("listener")
    assert [type(o) for o in listener.predict(docs)] == [OnDevice, OnDevice]


def test_the_frozen_output_cache_stays_on_the_host(device_nlp):
    nlp, train = device_nlp
    elmo = nlp.get_pipe("elmo")
    listener = nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("listener")
    for _ in range(2):  # computed, then read from the cache
        elmo.update(train)
        assert {type(o) for o in listener._outputs} == {OnDevice}
    assert elmo.frozen_cache.hits == len(train)
    assert host_entries(elmo.frozen_cache) == len(train)


def host_entries(cache) -> int:
    """How many entries `cache` keeps, each a numpy array on the host (or a
    failed assertion)."""
    entries = [cache.get(key) for key in list(cache)]
    assert {type(entry) for entry in entries} == {numpy.ndarray}
    return len(entries)


# -- on a CUDA GPU ---------------------------------------------------------------

LISTENING_CONFIGS, WORDS = test_any_width.LISTENING_CONFIGS, test_any_width.WORDS
token_corpus = test_any_width.token_corpus  # a fixture: sentences with entities, tags and UPOS
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="torch sees no CUDA GPU: these run on a machine with one (`make test-gpu`)",
)
CUDA = "cuda:0"
TEXTS = ["Stocks rallied after the central bank cut rates.", "", "Rain ."]


def on_cuda(test):
    """Mark a test `gpu` and skip it where torch sees no CUDA GPU."""
    return pytest.mark.gpu(needs_cuda(test))


@pytest.fixture()
def no_tf32():
    """float32 products in float32 (TF32 keeps 10 bits of their inputs' mantissas)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture()
def spacy_on_gpu(no_tf32):
    """spaCy and thinc on GPU 0 (cupy arrays), and back on the CPU after."""
    pytest.importorskip("cupy", reason="spaCy runs on a GPU through cupy, which is not installed")
    from thinc.api import require_cpu, require_gpu

    require_gpu(0)
    yield
    require_cpu()


def listener_paths(config: dict, path: tuple[str, ...] = ()):
    """The dotted config paths of the elmo listeners in `config`."""
    for key, value in config.items():
        if isinstance(value, dict):
            if str(value.get("@architectures", "")).startswith("elmo_spacy.ElmoListener"):
                yield ".".join((*path, key))
            yield from listener_paths(value, (*path, key))


@on_cuda
@needs_fixtures
@pytest.mark.usefixtures("no_tf32")
def test_the_reference_fixtures_on_cuda():
    from elmo_spacy.bilm.formats.bilm_tf import read_bilm_tf

    bilm = read_bilm_tf(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5").to(CUDA)
    batches = reference_batches()
    assert max_difference(bilm, batches[:1], stateful=False) < TOLERANCE
    assert max_difference(bilm, batches, stateful=True) < TOLERANCE


@on_cuda
def test_the_embedder_on_cuda_gives_the_cpu_vectors(bilm_dir):
    sentences = [text.split() for text in TEXTS]
    on_cpu = Embedder(bilm_dir).embed(sentences)
    on_gpu = Embedder(bilm_dir, device=CUDA).embed(sentences)
    for a, b in zip(on_cpu, on_gpu):
        assert type(b) is numpy.ndarray
        numpy.testing.assert_allclose(a, b, atol=1e-5)


@on_cuda
def test_embed_command_on_cuda(bilm_dir, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    for gpu_id, name in ((-1, "cpu.hdf5"), (0, "gpu.hdf5")):
        result = run("elmo-spacy", "embed", str(bilm_dir), str(corpus), str(tmp_path / name),
                     "--gpu-id", str(gpu_id))  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
    with h5py.File(tmp_path / "cpu.hdf5") as cpu, h5py.File(tmp_path / "gpu.hdf5") as gpu:
        assert set(cpu) == set(gpu)
        for key in cpu:
            if isinstance(cpu[key], h5py.Dataset) and cpu[key].dtype.kind == "f":
                numpy.testing.assert_allclose(cpu[key][...], gpu[key][...], atol=1e-4)


@on_cuda
def test_pretrain_on_cuda(tmp_path, corpus_dir):
    result = run(
        "elmo-spacy", "pretrain", str(CONFIGS / "bilm_tiny.cfg"), str(corpus_dir / "pretrain.txt"),
        str(tmp_path / "bilm"), "--gpu-id", "0", "--training.max_epochs", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    log = json.loads((tmp_path / "bilm" / "pretrain_log.json").read_text())
    assert 1 < log["epochs"][0]["dev_perplexity"]["mean"] < float("inf")
    bilm = load_bilm(tmp_path / "bilm" / "model-best")
    assert all(torch.isfinite(p).all() for p in bilm.parameters())


@on_cuda
@pytest.mark.parametrize(
    "encoder, kernel, clip",
    [
        ("char_cnn", "auto", 0.0),
        ("word", "auto", 0.0),
        ("word", "training", 3.0),
        ("char_cnn", "training", 3.0),
    ],
)
def test_a_training_step_fed_from_a_prepared_corpus_never_waits_on_the_device(
    encoder, kernel, clip
):
    """The batch comes from pinned memory without a wait, and the loss, its
    gradients, the clipping and Adam's update never bring a number back to
    the host (torch raises at any synchronisation in "error" mode): on
    cuDNN's LSTM, and on the training kernel with its Triton steps, clipped."""
    from elmo_spacy.pretrain import PretrainConfig
    from elmo_spacy.pretrain.batches import BatchBuilder, corpus_vocabulary, epoch_batches
    from elmo_spacy.pretrain.checkpoint import new_optimizer
    from elmo_spacy.pretrain.loop import RankLoss, training_step

    from .conftest import corpus_of

    corpus = corpus_of(tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()))
    clips = {"cell_clip": clip or None, "proj_clip": clip or None}
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "encoder": encoder, "word_dim": 16, **clips})
    bilm = BiLM(config, corpus_vocabulary(corpus.types, 500, 1)).to("cuda")
    optimizer = new_optimizer(bilm, PretrainConfig())
    build = BatchBuilder(corpus, bilm)
    plans = epoch_batches(
        corpus,
        seed=0,
        epoch=1,
        max_length=50,
        batch_tokens=400,
        exclude=numpy.zeros(0, "int64"),
    )
    batches = [build(pieces).pin_memory() for pieces in list(plans)[:4]]
    loss = RankLoss(bilm, world_size=1)
    forced = forced_kernel(kernel) if kernel != "auto" else contextlib.nullcontext()
    with forced:
        training_step(loss, optimizer, 5.0, batches[0], batches[0].targets.n_tokens)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            total = sum(
                training_step(loss, optimizer, 5.0, batch, batch.targets.n_tokens)
                for batch in batches
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(total)


@on_cuda
@pytest.mark.parametrize("grad_factor", [0.0, 1.0])
def test_the_elmo_pipe_trains_and_predicts_on_cuda(spacy_on_gpu, bilm_dir, corpus_dir, grad_factor):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, grad_factor)
    train = examples(nlp, corpus_dir / "train.spacy")[:32]
    optimizer = nlp.initialize(lambda: train)
    elmo = nlp.get_pipe("elmo")
    assert next(get_bilm(elmo.model).parameters()).is_cuda
    losses = {}
    for _ in range(2):
        for start in range(0, 32, 16):
            nlp.update(train[start : start + 16], sgd=optimizer, losses=losses)
    assert all(numpy.isfinite(loss) for loss in losses.values()) and losses["textcat"] > 0
    if grad_factor == 0:
        assert elmo.frozen_cache.hits == 32 and host_entries(elmo.frozen_cache) == 32
    docs = list(nlp.pipe(TEXTS))
    assert all(isinstance(doc._.elmo, numpy.ndarray) for doc in docs)
    if grad_factor == 0:  # the biLM is unchanged: the CPU's vectors
        expected = Embedder(bilm_dir).embed([[t.text for t in doc] for doc in docs])
        for doc, layers in zip(docs, expected):
            numpy.testing.assert_allclose(doc._.elmo, layers, atol=1e-5)


@on_cuda
@pytest.mark.parametrize("name", LISTENING_CONFIGS)
@pytest.mark.parametrize("grad_factor", [0.0, 1.0])
def test_spacy_train_on_cuda(spacy_on_gpu, name, grad_factor, bilm_dir, token_corpus, tmp_path):
    train_on_cuda(name, grad_factor, bilm_dir, token_corpus, token_corpus, tmp_path)


def train_on_cuda(name, grad_factor, bilm_dir, train_path, dev_path, tmp_path, overrides=None):
    """configs/NAME.cfg trained a few steps on GPU 0, its listeners' gradient
    `grad_factor`; the trained pipeline gives every token its layers. (The
    study's textcat configs: tests/study/test_textcat_configs.py.)"""
    config_path = CONFIGS / f"{name}.cfg"
    overrides = {
        "paths.train": str(train_path),
        "paths.dev": str(dev_path),
        "paths.bilm": str(bilm_dir),
        "training.max_steps": 4,
        "training.eval_frequency": 2,
        **(overrides or {}),
    }
    for path in listener_paths(spacy.util.load_config(config_path)):
        overrides[f"{path}.grad_factor"] = grad_factor
    train(config_path, tmp_path / "out", use_gpu=0, overrides=overrides)
    nlp = spacy.load(tmp_path / "out" / "model-last")
    doc = nlp(" ".join(WORDS))
    assert isinstance(doc._.elmo, numpy.ndarray) and doc._.elmo.shape[1] == len(doc)


@on_cuda
def test_fine_tuning_in_float16_on_cuda_scales_the_gradient(spacy_on_gpu, bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0, elmo_model={"run": {"precision": "float16"}})
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    elmo = nlp.get_pipe("elmo")
    bilm = get_bilm(elmo.model)
    assert bilm.precision == "float16" and elmo.model.shims[0]._grad_scaler._enabled
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    for start in range(0, 24, 8):
        nlp.update(train[start : start + 8], sgd=optimizer)
    after = bilm.state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert moved and all(torch.isfinite(after[k]).all() for k in moved)
