"""bilm-tf's format (the published ELMo models): conversion in and out, conformance
with the reference's own outputs, stateful replay, and errors on bad files."""

import json
import pickle
import shutil
from pathlib import Path

import h5py
import numpy
import pytest
import torch

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab, load_bilm, save_bilm
from elmo_spacy.bilm.formats.bilm_tf import BilmTfFormatError, read_bilm_tf, write_bilm_tf
from elmo_spacy.bilm.inputs.chars import BilmTfCharIds

from .conftest import CONFIGS, ROOT, cli, corpus_of, tokenize

FIXTURES = ROOT.parent / "shared" / "data" / "allennlp_elmo"
needs_fixtures = pytest.mark.skipif(
    not (FIXTURES / "lm_weights.hdf5").is_file(),
    reason=f"the reference ELMo fixtures are not at {FIXTURES} (they are not shipped with the "
    "repository; see the README of ../shared/data/allennlp_elmo)",
)
TOLERANCE = 1e-5

# A tiny biLM in bilm-tf's architecture, for the tests that need no fixtures.
TINY_ELMO = BiLMConfig(
    encoder="char_cnn",
    char_ids="bilm_tf",
    max_chars=50,
    char_dim=4,
    filters=[(1, 4), (2, 8), (3, 8)],
    n_highway=2,
    projection_dim=8,
    lstm_dim=16,
    n_layers=2,
    cell_clip=3.0,
    proj_clip=3.0,
    forget_bias=1.0,
    dropout=0.0,
    min_count=1,
)
SENTENCES = tokenize(
    [
        "The bank raised interest rates on Monday .",
        "She sat on the bank of the river .",
        "",
        "Antidisestablishmentarianism" * 3 + " <S> and </S> are tokens here .",
    ]
) + [["a", "lone", "surrogate", "\ud800", "."]]


def tiny_elmo(seed: int = 0, scale: float = 1.0) -> BiLM:
    torch.manual_seed(seed)
    bilm = BiLM(TINY_ELMO, WordVocab.specials_only(), with_softmax=False).eval()
    with torch.no_grad():
        for parameter in bilm.parameters():
            if parameter.requires_grad:
                parameter.mul_(scale)
    return bilm


def outputs(bilm: BiLM, docs) -> torch.Tensor:
    with torch.inference_mode():
        return bilm(bilm.batch(docs))


def reference_batches():
    sentences = json.loads((FIXTURES / "sentences.json").read_text())
    return [[sentences[k][i].split() for k in range(3)] for i in range(10)]


def reference_top_layer(k: int, i: int) -> numpy.ndarray:
    """Sentence i of sentences[k]: the reference's top layer, [forward; backward]."""
    with h5py.File(FIXTURES / f"lm_embeddings_{k}.hdf5") as file:
        both = file[str(i)][...]
    return numpy.concatenate([both[0], both[1]], axis=1)


def max_difference(bilm: BiLM, batches, stateful: bool) -> float:
    bilm.stateful = stateful
    bilm.reset_state()
    worst = 0.0
    for i, batch in enumerate(batches):
        top = outputs(bilm, batch)[-1]
        for k in range(2):
            mine = top[k, : len(batch[k])].cpu().numpy()
            worst = max(worst, float(abs(mine - reference_top_layer(k, i)).max()))
    return worst


@pytest.fixture(scope="module")
def reference_bilm() -> BiLM:
    return read_bilm_tf(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")


@needs_fixtures
def test_first_batch_from_zero_state_matches_the_reference(reference_bilm):
    assert max_difference(reference_bilm, reference_batches()[:1], stateful=False) < TOLERANCE


@needs_fixtures
def test_stateful_replay_of_ten_batches_matches_the_reference(reference_bilm):
    batches = reference_batches()
    assert max_difference(reference_bilm, batches, stateful=True) < TOLERANCE
    # Twice, after reset_state(): nothing of the first replay is left.
    assert max_difference(reference_bilm, batches, stateful=True) < TOLERANCE
    # Without the carried state, later batches are far off (the state matters).
    assert max_difference(reference_bilm, batches, stateful=False) > 0.1
    reference_bilm.stateful = False


@needs_fixtures
def test_clipping_binds_on_the_reference_inputs(reference_bilm):
    unclipped = read_bilm_tf(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    for stack in (unclipped.forward_lstm, unclipped.backward_lstm):
        stack.cell_clip = stack.proj_clip = 0.0
    assert max_difference(unclipped, reference_batches()[:1], stateful=False) > 0.1


@needs_fixtures
def test_convert_then_export_gives_back_every_dataset(tmp_path):
    result = cli(
        "convert-elmo",
        str(FIXTURES / "options.json"),
        str(FIXTURES / "lm_weights.hdf5"),
        str(tmp_path / "bilm"),
    )
    assert result.returncode == 0, result.stderr
    result = cli("export-elmo", str(tmp_path / "bilm"), str(tmp_path / "tf"))
    assert result.returncode == 0, result.stderr
    with (
        h5py.File(FIXTURES / "lm_weights.hdf5") as original,
        h5py.File(tmp_path / "tf" / "weights.hdf5") as exported,
    ):
        names = dataset_names(original)
        assert names == dataset_names(exported)
        for name in names:
            assert numpy.array_equal(original[name][...], exported[name][...]), name
    options = json.loads((tmp_path / "tf" / "options.json").read_text())
    assert options == json.loads((FIXTURES / "options.json").read_text())


@needs_fixtures
def test_export_then_convert_gives_bit_identical_outputs(tmp_path, reference_bilm):
    write_bilm_tf(reference_bilm, tmp_path / "tf")
    again = read_bilm_tf(tmp_path / "tf" / "options.json", tmp_path / "tf" / "weights.hdf5")
    batch = reference_batches()[0]
    assert torch.equal(outputs(reference_bilm, batch), outputs(again, batch))


def dataset_names(file: h5py.File) -> list[str]:
    names: list[str] = []
    file.visititems(
        lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None
    )
    return sorted(names)


# -- without the fixtures ------------------------------------------------------


def test_bilm_tf_character_ids():
    chars = BilmTfCharIds(max_chars=50, min_width=3)
    assert chars.token_ids("ab").tolist() == [258, 97, 98, 259]
    assert chars.token_ids("<S>").tolist() == [258, 256, 259]
    assert chars.token_ids("</S>").tolist() == [258, 257, 259]
    assert chars.token_ids("é\ud800").tolist() == [258, 0xC3, 0xA9, 259]  # bad UTF-8 dropped
    assert len(chars.token_ids("x" * 100)) == 50
    ids, lengths = chars.char_ids(["ab"])
    assert ids.tolist() == [
        [258, 256, 259, 260, 260, 260],
        [258, 257, 259, 260, 260, 260],
        [258, 97, 98, 259, 260, 260],
    ]
    assert lengths.tolist() == [3, 3, 4]


def test_few_columns_pool_as_the_full_fifty():
    bilm = tiny_elmo()
    types = ["a", "bank", "x" * 30, "<S>"]
    ids, lengths = bilm.chars.char_ids(types)
    assert ids.shape[1] < 50
    full = torch.full((len(ids), 50), bilm.chars.padding, dtype=torch.int64)
    full[:, : ids.shape[1]] = ids
    with torch.no_grad():
        torch.testing.assert_close(
            bilm.encoder(ids, lengths), bilm.encoder(full, lengths), rtol=0, atol=1e-6
        )


def test_stateful_rows_carry_keep_and_start_from_zero():
    """Batches of 3, then 2, then 4 rows: row 2 of the third batch goes on from
    the first batch (the second had no row 2), row 3 starts from zero."""
    bilm = tiny_elmo(seed=1)
    first, second, third = SENTENCES[:3], SENTENCES[1:3], [SENTENCES[i] for i in (0, 1, 3, 4)]
    bilm.stateful = True
    for batch in (first, second):
        outputs(bilm, batch)
    carried = outputs(bilm, third)
    # Row 2 alone: the same stream, first[2] then third[2].
    bilm.reset_state()
    outputs(bilm, [first[2]])
    row_2 = outputs(bilm, [third[2]])[:, 0]
    n = len(third[2])
    torch.testing.assert_close(carried[:, 2, :n], row_2, rtol=0, atol=1e-6)
    # Row 3 was never seen: it starts from zero, as without state.
    bilm.stateful = False
    fresh = outputs(bilm, [third[3]])[:, 0]
    torch.testing.assert_close(carried[:, 3, : len(third[3])], fresh, rtol=0, atol=1e-6)
    # Without state, the carried rows differ.
    assert not torch.allclose(carried[:, 2, :n], outputs(bilm, [third[2]])[:, 0], atol=1e-4)


def test_export_then_convert_a_biLM_trained_here(tmp_path):
    from elmo_spacy.pretrain import PretrainConfig, pretrain

    docs = SENTENCES * 4
    settings = PretrainConfig(max_epochs=1, batch_tokens=200, dev_fraction=0.0, patience=0)
    bilm_config = BiLMConfig(**{**TINY_ELMO.to_dict(), "softmax": "full"})
    pretrain(corpus_of(docs), bilm_config, settings, tmp_path / "run", show_progress=False)
    trained = load_bilm(tmp_path / "run" / "model-best", with_softmax=False)
    assert not torch.equal(
        trained.forward_lstm.layers[0].bias_ih_l0, tiny_elmo().forward_lstm.layers[0].bias_ih_l0
    )
    write_bilm_tf(trained, tmp_path / "tf")
    again = read_bilm_tf(tmp_path / "tf" / "options.json", tmp_path / "tf" / "weights.hdf5")
    assert torch.equal(outputs(trained, SENTENCES), outputs(again, SENTENCES))


def test_export_refuses_what_the_format_cannot_hold(tmp_path, bilm_dir):
    result = cli("export-elmo", str(bilm_dir), str(tmp_path / "out"))
    assert result.returncode == 1
    assert "char_ids = 'masked'" in result.stderr and "configs/bilm_elmo.cfg" in result.stderr
    word_config = BiLMConfig(encoder="word", word_dim=8, projection_dim=8, lstm_dim=16)
    word = BiLM(word_config, WordVocab.specials_only(), with_softmax=False)
    with pytest.raises(BilmTfFormatError, match="encoder is 'word'"):
        write_bilm_tf(word, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture
def exported(tmp_path) -> Path:
    write_bilm_tf(tiny_elmo(), tmp_path / "tf")
    return tmp_path / "tf"


def convert(folder: Path, tmp_path: Path):
    return cli(
        "convert-elmo",
        str(folder / "options.json"),
        str(folder / "weights.hdf5"),
        str(tmp_path / "converted"),
    )


def test_a_missing_dataset_is_named(exported, tmp_path):
    with h5py.File(exported / "weights.hdf5", "a") as file:
        del file["CNN_high_1/W_carry"]
    result = convert(exported, tmp_path)
    assert result.returncode == 1
    assert "missing CNN_high_1/W_carry" in result.stderr
    assert not (tmp_path / "converted").exists()


def test_a_shape_that_disagrees_with_the_options_is_named(exported, tmp_path):
    with h5py.File(exported / "weights.hdf5", "a") as file:
        del file["CNN/W_cnn_1"]
        file["CNN/W_cnn_1"] = numpy.zeros((1, 2, 4, 9), dtype="float32")
    result = convert(exported, tmp_path)
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert "CNN/W_cnn_1 has shape (1, 2, 4, 9)" in message and "(1, 2, 4, 8)" in message
    assert str(exported / "weights.hdf5") in message
    assert not (tmp_path / "converted").exists()


def test_an_unknown_option_is_refused(exported, tmp_path):
    options = json.loads((exported / "options.json").read_text())
    options["lstm"]["use_peepholes"] = True
    (exported / "options.json").write_text(json.dumps(options))
    result = convert(exported, tmp_path)
    assert result.returncode == 1
    assert "lstm.use_peepholes" in result.stderr and "options.json" in result.stderr
    assert not (tmp_path / "converted").exists()


def test_a_file_that_is_not_hdf5_is_refused(exported, tmp_path):
    (exported / "weights.hdf5").write_bytes(pickle.dumps({"char_embed": [1, 2, 3]}))
    result = convert(exported, tmp_path)
    assert result.returncode == 1
    assert "is not a readable HDF5 file" in result.stderr
    assert not (tmp_path / "converted").exists()


def test_nothing_is_unpickled_and_nothing_else_is_overwritten(exported, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("unpickling")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    bilm = read_bilm_tf(exported / "options.json", exported / "weights.hdf5")
    save_bilm(bilm, tmp_path / "converted")
    assert load_bilm(tmp_path / "converted").softmax is None
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="notes.txt"):
        save_bilm(bilm, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    shutil.rmtree(tmp_path / "mine")


def test_pretrain_with_the_exportable_config_then_export(tmp_path, corpus_dir):
    small = {
        "--bilm.char_dim": "4",
        "--bilm.filters": "[[1, 8], [2, 8]]",
        "--bilm.projection_dim": "8",
        "--bilm.lstm_dim": "16",
        "--bilm.cutoffs": "[50]",
        "--bilm.min_count": "1",
        "--training.max_steps": "3",
    }
    result = cli(
        "pretrain",
        str(CONFIGS / "bilm_elmo.cfg"),
        str(corpus_dir / "pretrain.txt"),
        str(tmp_path / "bilm"),
        *[part for item in small.items() for part in item],
    )
    assert result.returncode == 0, result.stderr[-2000:]
    result = cli("export-elmo", str(tmp_path / "bilm" / "model-best"), str(tmp_path / "tf"))
    assert result.returncode == 0, result.stderr[-2000:]
    trained = load_bilm(tmp_path / "bilm" / "model-best", with_softmax=False)
    assert trained.config.cell_clip == 3.0 and trained.config.char_ids == "bilm_tf"
    converted = read_bilm_tf(tmp_path / "tf" / "options.json", tmp_path / "tf" / "weights.hdf5")
    assert torch.equal(outputs(trained, SENTENCES), outputs(converted, SENTENCES))


# -- variants of the format, against bilm-tf's equations written out in numpy --


def reference_forward(
    options: dict, weights: dict, tokens: list[str], clipped: dict | None = None
) -> numpy.ndarray:
    """bilm-tf's forward pass for one sentence, from its equations (TensorFlow's
    layouts: x @ W, gates i, j, f, o, forget bias 1), stateless: (L + 1, n, 2P).
    `clipped` (if given) counts the values that the cell and projection clips cut."""
    clipped = {"cell": 0, "proj": 0} if clipped is None else clipped
    cnn, lstm = options["char_cnn"], options["lstm"]
    width = cnn["max_characters_per_token"]

    def char_ids(token: str) -> list[int]:
        marks = {"<S>": [256], "</S>": [257]}
        inner = marks.get(token) or list(token.encode("utf-8", "ignore")[: width - 2])
        return ([258, *inner, 259] + [260] * width)[:width]

    sigmoid = lambda z: 1 / (1 + numpy.exp(-z))  # noqa: E731
    activation = numpy.tanh if cnn["activation"] == "tanh" else (lambda z: numpy.maximum(z, 0))
    chars = weights["char_embed"][[char_ids(t) for t in ["<S>", *tokens, "</S>"]]]  # (T, W, c)
    pooled = []
    for i, (w, _) in enumerate(cnn["filters"]):
        kernel, bias = weights[f"CNN/W_cnn_{i}"][0], weights[f"CNN/b_cnn_{i}"]
        windows = sum(chars[:, k : width - w + 1 + k] @ kernel[k] for k in range(w)) + bias
        pooled.append(activation(windows.max(axis=1)))
    x = numpy.concatenate(pooled, axis=-1)
    for k in range(cnn.get("n_highway") or 0):
        high = {
            n: weights[f"CNN_high_{k}/{n}"]
            for n in ("W_carry", "b_carry", "W_transform", "b_transform")
        }
        carry = sigmoid(x @ high["W_carry"] + high["b_carry"])
        x = (
            carry * numpy.maximum(x @ high["W_transform"] + high["b_transform"], 0)
            + (1 - carry) * x
        )
    if "CNN_proj/W_proj" in weights:
        x = x @ weights["CNN_proj/W_proj"] + weights["CNN_proj/b_proj"]

    def direction(inputs: numpy.ndarray, d: int) -> list[numpy.ndarray]:
        outputs = []
        for layer in range(lstm["n_layers"]):
            path = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            kernel, bias = weights[f"{path}/W_0"], weights[f"{path}/B"]
            cell_dim = bias.shape[0] // 4
            h = numpy.zeros(lstm["projection_dim"], dtype="float32")
            c = numpy.zeros(cell_dim, dtype="float32")
            ys = []
            for x_t in inputs:
                i, j, f, o = numpy.split(numpy.concatenate([x_t, h]) @ kernel + bias, 4)
                c = sigmoid(f + 1.0) * c + sigmoid(i) * numpy.tanh(j)
                if lstm.get("cell_clip"):
                    clipped["cell"] += int((abs(c) > lstm["cell_clip"]).sum())
                    c = numpy.clip(c, -lstm["cell_clip"], lstm["cell_clip"])
                h = sigmoid(o) * numpy.tanh(c)
                if f"{path}/W_P_0" in weights:
                    h = h @ weights[f"{path}/W_P_0"]
                    if lstm.get("proj_clip"):
                        clipped["proj"] += int((abs(h) > lstm["proj_clip"]).sum())
                        h = numpy.clip(h, -lstm["proj_clip"], lstm["proj_clip"])
                ys.append(h)
            y = numpy.stack(ys)
            inputs = y + inputs if layer > 0 and lstm.get("use_skip_connections") else y
            outputs.append(inputs)
        return outputs

    forward, backward = direction(x, 0), [y[::-1] for y in direction(x[::-1], 1)]
    layers = [numpy.concatenate([x, x], -1)]
    layers += [numpy.concatenate(fb, -1) for fb in zip(forward, backward)]
    return numpy.stack(layers)[:, 1:-1]


def write_random_bilm_tf(folder: Path, options: dict, seed: int = 0) -> dict:
    """options.json and a weights.hdf5 of random weights for `options`, as
    bilm-tf names and shapes them (scaled so that the clips bind)."""
    from elmo_spacy.bilm.formats.bilm_tf import config_from_options, expected_shapes

    rng = numpy.random.default_rng(seed)
    shapes = expected_shapes(config_from_options(options, "test"))
    weights = {name: rng.normal(0, 0.6, shape).astype("float32") for name, shape in shapes.items()}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "options.json").write_text(json.dumps(options))
    with h5py.File(folder / "weights.hdf5", "w") as file:
        for name, array in weights.items():
            file.create_dataset(name, data=array)
    return weights


VARIANTS = {
    "as the published models": {
        "lstm": {
            "dim": 24,
            "projection_dim": 8,
            "n_layers": 2,
            "cell_clip": 3,
            "proj_clip": 3,
            "use_skip_connections": True,
        },
        "char_cnn": {
            "activation": "relu",
            "filters": [[1, 4], [2, 8], [3, 8]],
            "n_highway": 2,
            "embedding": {"dim": 4},
            "n_characters": 262,
            "max_characters_per_token": 50,
        },
    },
    "no highway key, tanh, no char projection, one layer": {
        "lstm": {"dim": 24, "projection_dim": 12, "n_layers": 1, "cell_clip": 3, "proj_clip": 3},
        "char_cnn": {
            "activation": "tanh",
            "filters": [[1, 4], [2, 8]],
            "embedding": {"dim": 4},
            "n_characters": 261,
            "max_characters_per_token": 20,
        },
        "n_tokens_vocab": 1000,
        "sample_softmax": True,
    },
    "no LSTM projection, no skip connection": {
        "lstm": {
            "dim": 8,
            "projection_dim": 8,
            "n_layers": 2,
            "cell_clip": 1,
            "proj_clip": 0.5,
            "use_skip_connections": False,
        },
        "char_cnn": {
            "activation": "relu",
            "filters": [[1, 4], [2, 8]],
            "n_highway": 1,
            "embedding": {"dim": 4},
            "n_characters": 262,
            "max_characters_per_token": 50,
        },
    },
}


@needs_fixtures
def test_the_numpy_reference_reproduces_the_fixtures():
    """The equations of `reference_forward` are bilm-tf's: on the fixture model,
    the first batch's top layer is the reference's own."""
    options = json.loads((FIXTURES / "options.json").read_text())
    with h5py.File(FIXTURES / "lm_weights.hdf5") as file:
        weights = {name: file[name][...] for name in dataset_names(file)}
    for k, sentence in enumerate(reference_batches()[0][:2]):
        top = reference_forward(options, weights, sentence)[-1]
        assert abs(top - reference_top_layer(k, 0)).max() < TOLERANCE


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_of_the_format_computes_what_bilm_tf_computes(tmp_path, variant):
    options = VARIANTS[variant]
    weights = write_random_bilm_tf(tmp_path / "tf", options)
    bilm = load_bilm(tmp_path / "tf")
    docs = SENTENCES[:2] + [["A", "x" * 60, "<S>"]]
    mine = outputs(bilm, docs)
    clipped = {"cell": 0, "proj": 0}
    for b, doc in enumerate(docs):
        expected = reference_forward(options, weights, doc, clipped)
        numpy.testing.assert_allclose(mine[:, b, : len(doc)].numpy(), expected, rtol=0, atol=1e-5)
    # The clips bind on these inputs, so the comparison covers them: some cell
    # value and, where the LSTM projects, some projected value were cut.
    assert clipped["cell"] > 0
    assert clipped["proj"] > 0 or options["lstm"]["dim"] == options["lstm"]["projection_dim"]
    # And back out: export gives the same datasets and the same outputs again.
    write_bilm_tf(bilm, tmp_path / "again")
    with h5py.File(tmp_path / "again" / "weights.hdf5") as file:
        assert dataset_names(file) == sorted(weights)
        for name, array in weights.items():
            assert numpy.array_equal(file[name][...], array), name
    assert torch.equal(outputs(load_bilm(tmp_path / "again"), docs), mine)


def test_the_fixed_forget_bias_is_a_constant_and_folders_saved_before_load():
    """bilm-tf's forget bias is a buffer under the parameter's old name, so a
    biLM folder saved when it was a frozen parameter loads and computes as
    it did (tests/data/bilm_tf_saved_before: written by the code before)."""
    saved = ROOT / "tests" / "data" / "bilm_tf_saved_before"
    bilm = load_bilm(saved / "bilm")
    layer = bilm.forward_lstm.layers[0]
    assert "bias_hh_l0" in dict(layer.named_buffers())
    assert "bias_hh_l0" not in dict(layer.named_parameters())
    bilm.requires_grad_(True)
    assert not [name for name, _ in bilm.named_parameters() if "bias_hh" in name]
    with torch.inference_mode():
        layers = bilm(bilm.batch([["The", "bank", "rose", "."], ["Hi"]]))
    expected = numpy.load(saved / "layers.npy")
    mask = bilm.batch([["The", "bank", "rose", "."], ["Hi"]]).mask().numpy()
    numpy.testing.assert_array_equal(layers.numpy()[:, mask], expected[:, mask])
    assert numpy.all(layers.numpy()[:, ~mask] == 0)  # padding: zero now


def test_padded_positions_are_zero_and_the_mask_says_where_vectors_are():
    bilm = tiny_elmo(scale=3.0)
    batch = bilm.batch([["a", "b", "c"], ["d"], []])
    assert batch.mask().tolist() == [[True] * 3, [True, False, False], [False] * 3]
    assert batch.mask(boundaries=True).sum(1).tolist() == [5, 3, 2]
    for boundaries in (False, True):
        layers = bilm(batch, boundaries=boundaries)
        mask = batch.mask(boundaries=boundaries)
        assert layers.shape[2] == mask.shape[1]
        assert layers[:, ~mask].abs().max() == 0 and layers[:, mask].abs().min() > 0
    bilm.train()  # in training too
    assert bilm(batch)[:, ~batch.mask()].abs().max() == 0
