"""bfloat16: close to float32 where it runs, float32 where it does not pay, and
the float32 path untouched."""

import warnings

import numpy
import pytest
import spacy
import torch
from safetensors.torch import load_file
from spacy.cli._util import parse_config_overrides

import elmo_spacy.bilm.runtime.kernels as kernels_module
import elmo_spacy.bilm.runtime.precision as precision_module
import elmo_spacy.bilm.runtime.products as products_module
from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab, load_bilm
from elmo_spacy.bilm.model.softmax import adaptive_nll, summed_nll
from elmo_spacy.bilm.runtime.products import onednn_packing
from elmo_spacy.embedder import Embedder
from elmo_spacy.layers import get_bilm, get_runner
from elmo_spacy.pretrain import PretrainConfig, ProcessGroup, load_pretrain_config, pretrain
from elmo_spacy.pretrain.checkpoint import STATE_FILE
from elmo_spacy.pretrain.run_folder import RunFolder

from .conftest import CONFIGS, DATA, TINY_BILM, corpus_of, tokenize

DOCS = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:40])
SENTENCES = DOCS[:12]
# bilm-tf's architecture (clipped cell and projection, one bias), small.
CLIPPED = {"cell_clip": 3.0, "proj_clip": 3.0, "forget_bias": 1.0, "char_ids": "bilm_tf"}
# Measured on these sentences, random weights (as training starts), an AMX CPU,
# layers 0 / 1 / 2: max |bf16 - f32| over max |f32|
#   char_cnn 0.0053 / 0.0066 / 0.0077 (mean |diff| 1.3e-3 / 3.0e-4 / 3.9e-4),
#   word     0.0040 / 0.0040 / 0.0065 (mean |diff| 1.2e-3 / 2.3e-4 / 2.9e-4);
# mean cosine >= 0.99998. The bounds leave a factor of 2.5 on the max.
MAX_RELATIVE_DIFF = 0.02  # max |bf16 - f32| over max |f32|, per layer
MIN_COSINE = 0.9995  # mean cosine of a position's vectors, per layer


@pytest.fixture(autouse=True)
def bfloat16_runs_here(monkeypatch):
    """Run bfloat16 whatever this CPU is: where it lacks the instructions,
    torch emulates them (slowly, but the numbers are the same). On one
    thread: oneDNN's bfloat16 kernels use every thread even for tiny
    products, and wait for each other on busy cores (these tests' steps take
    100x longer on two threads while another process holds the cores)."""
    monkeypatch.setattr(precision_module, "bfloat16_unsupported", lambda device="cpu": None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_bilm(encoder: str, **settings) -> BiLM:
    torch.manual_seed(0)
    config = BiLMConfig(
        **{**TINY_BILM.to_dict(), "encoder": encoder, "word_dim": 16, **CLIPPED, **settings}
    )
    return BiLM(config, WordVocab.build(DOCS, max_size=2000, min_count=1)).eval()


def layers_of(bilm: BiLM, sentences, gradients: bool = False) -> torch.Tensor:
    """(L + 1, N, 2P) vectors of the real positions of `sentences`, computed
    as inference does or, with `gradients`, as training does (no kept
    encodings, no packed weights)."""
    with torch.inference_mode(not gradients):
        layers = bilm(bilm.batch(sentences)).detach()
    real = torch.zeros(layers.shape[1:3], dtype=torch.bool)
    for i, sentence in enumerate(sentences):
        real[i, : len(sentence)] = True
    return layers[:, real]


def assert_close_per_layer(low: torch.Tensor, high: torch.Tensor) -> None:
    """`low` (bfloat16 run) within the bounds above of `high` (float32), per layer."""
    for i, (a, b) in enumerate(zip(low, high)):
        relative = float((a - b).abs().max() / b.abs().max())
        cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())
        assert relative < MAX_RELATIVE_DIFF, f"layer {i}: max diff {relative:.4f} of the scale"
        assert cosine > MIN_COSINE, f"layer {i}: mean cosine {cosine:.6f}"


@pytest.mark.parametrize("encoder", ["char_cnn", "word"])
def test_bfloat16_forward_is_close_to_float32(encoder):
    bilm = tiny_bilm(encoder)
    reference = layers_of(bilm, SENTENCES)
    bilm.precision = "bfloat16"
    low = layers_of(bilm, SENTENCES)
    assert low.dtype == torch.float32
    assert not torch.equal(low, reference)  # it did run in bfloat16
    assert_close_per_layer(low, reference)
    assert_close_per_layer(layers_of(bilm, SENTENCES, gradients=True), reference)


def test_bfloat16_packs_its_own_weights_for_onednn_where_onednn_can():
    if not onednn_packing():
        pytest.skip("this torch has no oneDNN packed linear")
    onednn_packing.cache_clear()  # first asked under bfloat16 autocast, it must still say yes
    bilm = tiny_bilm("char_cnn")
    bilm.precision = "bfloat16"
    layers_of(bilm, SENTENCES)
    with torch.inference_mode():
        packed = bilm.inference_cache().packed
    dtypes = {weight.dtype for layer in packed.values() for weight in layer.values()}
    if onednn_packing(torch.bfloat16):
        assert dtypes == {torch.bfloat16}
    else:  # oneDNN has no bfloat16 path on this CPU (AVX2 only): plain GEMMs instead
        assert torch.bfloat16 not in dtypes


@pytest.fixture
def no_bfloat16_packing(monkeypatch):
    """oneDNN as on an AVX2-only host: it packs float32 weights, not bfloat16 ones."""
    real = products_module.onednn_packing

    def float32_only(dtype=torch.float32):
        return dtype == torch.float32 and real()

    for module in (products_module, kernels_module):
        monkeypatch.setattr(module, "onednn_packing", float32_only)


@pytest.mark.parametrize("encoder", ["char_cnn", "word"])
def test_bfloat16_without_onednns_bfloat16_path_runs_plain_products(no_bfloat16_packing, encoder):
    bilm = tiny_bilm(encoder)
    reference = layers_of(bilm, SENTENCES)
    bilm.precision = "bfloat16"
    low = layers_of(bilm, SENTENCES)
    assert not torch.equal(low, reference)
    assert_close_per_layer(low, reference)
    with torch.inference_mode():
        packed = bilm.inference_cache().packed
    assert all(w.dtype != torch.bfloat16 for layer in packed.values() for w in layer.values())
    bilm.train()
    bilm.lm_loss(bilm.batch(SENTENCES)).mean.backward()  # the training kernel too
    assert all(torch.isfinite(p.grad).all() for p in bilm.parameters() if p.grad is not None)


def test_switching_precision_forgets_what_the_other_computed():
    bilm = tiny_bilm("char_cnn")
    reference = layers_of(bilm, SENTENCES)
    bilm.precision = "bfloat16"
    layers_of(bilm, SENTENCES)  # fills the type cache with bfloat16 encodings
    bilm.precision = "float32"
    assert torch.equal(layers_of(bilm, SENTENCES), reference)


def test_float32_never_enters_autocast(monkeypatch):
    bilm = tiny_bilm("char_cnn")

    def refuse(*args, **kwargs):
        raise AssertionError("float32 entered autocast")

    monkeypatch.setattr(torch, "autocast", refuse)
    layers_of(bilm, SENTENCES)
    bilm.train()
    bilm.lm_loss(bilm.batch(SENTENCES)).mean.backward()


def test_bfloat16_loss_is_float32_and_close():
    bilm = tiny_bilm("char_cnn")
    assert bilm.softmax.adaptive
    with torch.no_grad():
        reference = bilm.lm_loss(bilm.batch(DOCS))
        bilm.precision = "bfloat16"
        low = bilm.lm_loss(bilm.batch(DOCS))
    assert low.forward_nll.dtype == low.backward_nll.dtype == torch.float32
    assert float(low.mean) != float(reference.mean)
    # measured: 1.3e-5 relative (the log-softmax and the sums are float32)
    assert float(low.mean) == pytest.approx(float(reference.mean), rel=1e-3)


def test_adaptive_nll_is_the_adaptive_softmax_loss():
    torch.manual_seed(0)
    softmax = torch.nn.AdaptiveLogSoftmaxWithLoss(16, 300, [20, 100], div_value=4.0)
    hidden, targets = torch.randn(64, 16), torch.randint(0, 300, (64,))
    with torch.no_grad():
        expected = softmax(hidden, targets).loss * 64
    # grouped by cluster, as LMTargets groups them: rows of one cluster in one slice
    cluster = torch.bucketize(targets, torch.tensor([20, 100]), right=True)
    order = torch.argsort(cluster, stable=True)
    hidden, targets = hidden[order], targets[order]
    splits = [0, *torch.cumsum(torch.bincount(cluster, minlength=3), 0).tolist()]
    with torch.no_grad():
        nll = adaptive_nll(softmax, hidden, targets, splits)
        assert float(nll) == pytest.approx(float(expected), 1e-6)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = adaptive_nll(softmax, hidden, targets, splits)
    assert low.dtype == torch.float32
    assert float(low) == pytest.approx(float(expected), rel=1e-2)


def test_summed_nll_is_the_summed_cross_entropy_forward_and_backward():
    torch.manual_seed(0)
    logits = torch.randn(40, 30, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 30, (40,))
    weight = torch.tensor(0.37, dtype=torch.float64)  # as a mean scales the sum
    expected = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    (expected_grad,) = torch.autograd.grad(expected * weight, logits)
    got = summed_nll(logits, targets)
    (got_grad,) = torch.autograd.grad(got * weight, logits)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=1e-12)
    low = logits.detach().bfloat16().requires_grad_()
    low_nll = summed_nll(low, targets)
    (low_grad,) = torch.autograd.grad(low_nll * weight, low)
    assert low_nll.dtype == torch.float32 and low_grad.dtype == torch.bfloat16
    assert float(low_nll.detach()) == pytest.approx(float(expected.detach()), rel=1e-2)
    torch.testing.assert_close(low_grad.double(), expected_grad, rtol=0, atol=4e-3)


def test_pipe_in_bfloat16_gives_float32_layers_close_to_float32_and_keeps_its_setting(
    bilm_dir, tmp_path
):
    texts = ["Stocks fell sharply on Monday after the report.", "Rain.", ""]
    reference = spacy.blank("en")
    reference.add_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    nlp = spacy.blank("en")
    elmo = nlp.add_pipe("elmo", config={"model": {"run": {"precision": "bfloat16"}}})
    elmo.initialize(lambda: [], bilm_path=bilm_dir)
    assert get_bilm(elmo.model).precision == "bfloat16"
    docs = list(nlp.pipe(texts))
    for doc, expected in zip(docs, reference.pipe(texts)):
        assert doc._.elmo.dtype == numpy.float32
        assert doc._.elmo.shape == expected._.elmo.shape
        if len(doc):
            low, high = torch.from_numpy(doc._.elmo), torch.from_numpy(expected._.elmo)
            assert not torch.equal(low, high)
            assert_close_per_layer(low, high)
    nlp.to_disk(tmp_path / "nlp")
    loaded = spacy.load(tmp_path / "nlp")
    assert loaded.config["components"]["elmo"]["model"]["run"]["precision"] == "bfloat16"
    assert get_bilm(loaded.get_pipe("elmo").model).precision == "bfloat16"
    for doc, again in zip(docs, loaded.pipe(texts)):
        assert numpy.array_equal(doc._.elmo, again._.elmo)
    elmo.from_disk(tmp_path / "nlp" / "elmo")  # a new biLM, the pipe's setting
    assert get_bilm(elmo.model).precision == "bfloat16"
    float32 = spacy.load(
        tmp_path / "nlp",
        config={"components": {"elmo": {"model": {"run": {"precision": "float32"}}}}},
    )
    assert numpy.array_equal(float32(texts[0])._.elmo, reference(texts[0])._.elmo)


def test_a_reduced_precision_keeps_float32_weights(bilm_dir):
    assert load_bilm(bilm_dir).precision == "float32"
    bilm = load_bilm(bilm_dir)
    bilm.precision = "bfloat16"
    assert bilm.precision == "bfloat16"
    assert all(p.dtype == torch.float32 for p in bilm.parameters())


def test_pretraining_in_bfloat16_learns_and_saves_float32(tmp_path):
    config = BiLMConfig(**{**TINY_BILM.to_dict(), **CLIPPED})  # the clipped loop kernel
    settings = PretrainConfig(
        max_epochs=2,
        batch_tokens=600,
        learning_rate=0.005,
        patience=0,
        checkpoint_every=3,
        dev_fraction=0.0,
        precision="bfloat16",
    )
    log = pretrain(corpus_of(DOCS), config, settings, tmp_path, show_progress=False)
    assert log["precision"] == "bfloat16"
    dev = [epoch["dev_perplexity"]["mean"] for epoch in log["epochs"]]
    assert dev[1] < dev[0]
    weights = load_file(str(tmp_path / "model-last" / "weights.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.float32}
    state = load_file(str(RunFolder(tmp_path).latest_checkpoint() / STATE_FILE))
    assert {t.dtype for k, t in state.items() if k.startswith("optimizer.")} == {torch.float32}
    assert load_bilm(tmp_path / "model-last").precision == "float32"


def test_bfloat16_where_it_does_not_pay_warns_and_runs_float32(monkeypatch, bilm_dir):
    reason = "this CPU lacks avx512_bf16 and amx_bf16"
    monkeypatch.setattr(precision_module, "bfloat16_unsupported", lambda device="cpu": reason)
    bilm = tiny_bilm("word")
    reference = layers_of(bilm, SENTENCES)
    with pytest.warns(RuntimeWarning, match="runs as 'float32': this CPU lacks avx512_bf16"):
        bilm.precision = "bfloat16"
    assert bilm.precision == "float32"
    assert torch.equal(layers_of(bilm, SENTENCES), reference)
    nlp = spacy.blank("en")
    elmo = nlp.add_pipe("elmo", config={"model": {"run": {"precision": "bfloat16"}}})
    with pytest.warns(RuntimeWarning, match=r"run.precision = 'bfloat16' runs"):
        elmo.initialize(lambda: [], bilm_path=bilm_dir)
    assert get_bilm(elmo.model).precision == "float32"
    assert get_runner(elmo.model).settings.precision == "bfloat16"  # what was asked for, kept


def test_one_rank_warns_of_the_fall_back_for_all(monkeypatch, tmp_path):
    monkeypatch.setattr(precision_module, "bfloat16_unsupported", lambda device="cpu": "no")
    settings = PretrainConfig(max_epochs=1, batch_tokens=600, patience=0, precision="bfloat16")
    with pytest.warns(RuntimeWarning, match=r"\[training\] precision = 'bfloat16' runs as"):
        assert (
            pretrain(corpus_of(DOCS), TINY_BILM, settings, tmp_path / "0")["precision"] == "float32"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        log = pretrain(
            corpus_of(DOCS), TINY_BILM, settings, tmp_path / "1", group=ProcessGroup(rank=1)
        )
    assert log["precision"] == "float32"


def test_the_warning_points_at_the_users_line(monkeypatch, bilm_dir):
    monkeypatch.setattr(precision_module, "bfloat16_unsupported", lambda device="cpu": "no")
    with pytest.warns(RuntimeWarning, match="BiLM.precision = 'bfloat16' runs as") as caught:
        tiny_bilm("word").precision = "bfloat16"
    with pytest.warns(RuntimeWarning, match="run.precision = 'bfloat16' runs as") as more:
        Embedder(bilm_dir, precision="bfloat16")
    assert [w.filename for w in [*caught, *more]] == [__file__, __file__]


@pytest.mark.parametrize(
    "machine, x86, linux_flags, multiplies",
    [
        ("x86_64", {"avx512_bf16"}, None, True),
        ("AMD64", {"amx_tile"}, None, True),
        ("x86_64", set(), None, False),  # AVX-512 alone: oneDNN would emulate bfloat16
        ("aarch64", set(), {"asimd", "bf16"}, True),
        ("aarch64", set(), {"asimd"}, False),
        ("arm64", set(), None, True),  # not Linux: no flags to read
    ],
)
def test_bfloat16_instructions_are_found_on_each_kind_of_cpu(
    monkeypatch, machine, x86, linux_flags, multiplies
):
    monkeypatch.setattr(precision_module.platform, "machine", lambda: machine)
    for name in precision_module.X86_BF16_CHECKS:
        monkeypatch.setattr(torch.cpu, f"_is_{name}_supported", lambda name=name: name in x86)
    flags = None if linux_flags is None else " ".join(linux_flags)
    monkeypatch.setattr(precision_module, "_cpuinfo_value", lambda keys: flags)
    assert precision_module.cpu_multiplies_bfloat16() is multiplies


@pytest.mark.parametrize(
    "float32, bfloat16, pays", [(300.0, 170.0, False), (220.0, 440.0, True)], ids=["XEON-D", "EPYC"]
)
def test_auto_takes_bfloat16_only_where_it_multiplies_faster_and_bfloat16_is_honoured(
    monkeypatch, float32, bfloat16, pays
):
    """Intel CPUs with AVX512-BF16 and no AMX multiply bfloat16 at about
    half their float32 rate (XEON-D in docs/results.md; AMD's with the same
    instructions at twice): "auto" times both and takes the faster;
    "bfloat16", asked for, runs bfloat16 whatever a timing says, warning
    where the CPU may be slower."""
    monkeypatch.undo()  # the autouse fixture's bfloat16 everywhere
    monkeypatch.setattr(precision_module, "_cpu_bfloat16_unsupported", lambda: None)
    monkeypatch.setattr(precision_module, "cpu_product_rates", lambda: (float32, bfloat16))
    precision_module._cpu_bfloat16_slower.cache_clear()
    try:
        auto = precision_module.resolve_precision("auto", "cpu")
        for slower_kind, warns in ((True, True), (False, False)):
            monkeypatch.setattr(
                precision_module, "cpu_bfloat16_may_be_slower", lambda s=slower_kind: s
            )
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert precision_module.resolve_precision("bfloat16", "cpu") == "bfloat16"
            assert bool(caught) is warns
            if warns:
                assert "precision = 'auto' times both" in str(caught[0].message)
    finally:
        precision_module._cpu_bfloat16_slower.cache_clear()
    assert auto == ("bfloat16" if pays else "float32")
    monkeypatch.setattr(precision_module, "_cpu_bfloat16_unsupported", lambda: "no bfloat16 here")
    assert precision_module.resolve_precision("auto", "cpu") == "float32"
    with pytest.warns(RuntimeWarning, match="runs as 'float32': no bfloat16 here"):
        assert precision_module.resolve_precision("bfloat16", "cpu") == "float32"


def test_the_product_rates_are_measured_without_touching_torchs_generator():
    state = torch.get_rng_state()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as a check inside a bfloat16 run
        float32, bfloat16 = precision_module.cpu_product_rates(rows=8, width=16, rounds=1)
    assert float32 > 0 and bfloat16 > 0
    assert torch.equal(torch.get_rng_state(), state)


def test_a_precision_that_does_not_exist_is_refused_with_the_choices(bilm_dir, tmp_path):
    choices = "use one of 'float32', 'bfloat16', 'float16'"
    with pytest.raises(ValueError, match=f"precision = 'int8'.*{choices}"):
        tiny_bilm("word").precision = "int8"
    with pytest.raises(ValueError, match=rf"run.precision = 'int8'.*{choices}"):
        spacy.blank("en").add_pipe("elmo", config={"model": {"run": {"precision": "int8"}}})
    with pytest.raises(ValueError, match=r"\[training\] precision = 'int8': one of float32"):
        PretrainConfig(precision="int8")
    with pytest.raises(ValueError, match="precision = 'int8'"):  # before reading any file
        Embedder(tmp_path / "missing", precision="int8")


def test_pretraining_configs_say_float32_and_the_command_line_overrides_it():
    for path in sorted(CONFIGS.glob("bilm*.cfg")):
        assert load_pretrain_config(path)[1].precision == "float32", path.name
    overrides = parse_config_overrides(["--training.precision", "bfloat16"])  # as the CLI does
    assert load_pretrain_config(CONFIGS / "bilm.cfg", overrides)[1].precision == "bfloat16"
    with pytest.raises(ValueError, match="precision = 'fp16'"):
        load_pretrain_config(CONFIGS / "bilm.cfg", {"training.precision": "fp16"})


def test_the_onednn_probe_leaves_torchs_random_numbers_alone():
    """It runs once per process (cached): drawing from torch's global generator
    gave the first pretraining run in a process other dropout masks than the next."""
    torch.manual_seed(0)
    expected = torch.rand(4)
    onednn_packing.cache_clear()
    torch.manual_seed(0)
    onednn_packing()
    assert torch.equal(torch.rand(4), expected)


def test_float32_on_a_gpu_keeps_cudnns_convolutions_out_of_tf32():
    """torch runs cuDNN's convolutions in TF32 unless told not to; the
    float32 path turns that off while it runs (on a GPU only) and restores it."""
    float32_convolutions = precision_module.float32_convolutions
    assert torch.backends.cudnn.allow_tf32  # torch's default
    with float32_convolutions(torch.device("cpu")):
        assert torch.backends.cudnn.allow_tf32
    with pytest.raises(RuntimeError), float32_convolutions(torch.device("cuda")):
        assert not torch.backends.cudnn.allow_tf32
        raise RuntimeError
    assert torch.backends.cudnn.allow_tf32
