"""ELMoForManyLangs' format: conformance with the reference's own outputs, the
variants of its architecture against its equations written out, every way a
user loads such a model, and errors on bad folders."""

import json
import pickle
import shutil
from pathlib import Path

import h5py
import numpy
import pytest
import spacy
import torch
from torch import nn
from typer.testing import CliRunner

from elmo_spacy.bilm import load_bilm
from elmo_spacy.bilm.formats.efml import PUBLISHED_ARCHITECTURES, EfmlFormatError, read_efml
from elmo_spacy.cli import app

from .conftest import ROOT

FIXTURES = ROOT.parent / "shared" / "data" / "elmoformanylangs"
needs_fixtures = pytest.mark.skipif(
    not (FIXTURES / "outputs.hdf5").is_file(),
    reason=f"the ELMoForManyLangs fixtures are not at {FIXTURES} (they are not shipped with "
    "the repository; see the README of ../shared/data/elmoformanylangs)",
)
SENTENCES = [
    ["The", "bank", "raised", "rates", "."],
    ["Zürich", "und", "北京", "😀", "<bos>", "<S>", "<pad>"],
    ["x"],
    ["Supercalifragilisticexpialidocious", "is", "long", "."],
]


def fixture_outputs() -> tuple[list[list[str]], list[numpy.ndarray]]:
    sentences = [s.split(" ") for s in json.loads((FIXTURES / "sentences.json").read_text())]
    with h5py.File(FIXTURES / "outputs.hdf5", "r") as file:
        outputs = [file[str(i)][...] for i in range(len(sentences))]
    return sentences, outputs


def assert_conforms(ours: numpy.ndarray, reference: numpy.ndarray) -> None:
    """Layer 0 (no recurrence) to float32 rounding of the sums that make it
    (its values reach 519); the LSTM layers as close as the reference comes to
    its own outputs: run on another CPU than the one that wrote them, it is
    up to 2.4e-4 off (a sentence's mean up to 1.4e-5), as the fixture's
    weights make a one-ulp change of the input move the top layer by up to
    3e-4."""
    assert ours.shape == reference.shape
    assert numpy.abs(ours[0] - reference[0]).max() <= 1e-6 * numpy.abs(reference[0]).max()
    gap = numpy.abs(ours[1:] - reference[1:])
    assert gap.max() <= 5e-4 and gap.mean() <= 3e-5, (gap.max(), gap.mean())


@needs_fixtures
def test_each_sentence_alone_computes_what_elmoformanylangs_computes():
    bilm = load_bilm(FIXTURES / "model")
    sentences, outputs = fixture_outputs()
    with torch.no_grad():
        for tokens, reference in zip(sentences, outputs):
            assert_conforms(bilm(bilm.batch([tokens]))[:, 0].numpy(), reference)
        together = bilm(bilm.batch(sentences))  # one padded batch: the same, row by row
    for i, (tokens, reference) in enumerate(zip(sentences, outputs)):
        assert_conforms(together[:, i, : len(tokens)].numpy(), reference)


@needs_fixtures
def test_the_reference_quirks_are_kept():
    bilm = load_bilm(FIXTURES / "model")
    assert bilm.config.encoder == "word_char" and bilm.config.char_ids == "char_vocab"
    chars = bilm.chars
    index = {c: i for i, c in enumerate(bilm.char_vocab)}
    row = chars.token_ids("ab")
    assert [row[0], row[-1]] == [index["<eow>"], index["<bow>"]]  # the swapped marks
    assert chars.token_ids("<bos>").tolist() == [index["<eow>"], index["<bos>"], index["<bow>"]]
    assert len(chars.token_ids("x" * 40)) == bilm.config.max_chars  # cut to 18 characters
    assert chars.token_ids("€")[1] == index.get("€", index["<oov>"])  # characters, not bytes
    assert bilm.vocab.words[:4] == ["<pad>", "<oov>", "<bos>", "<eos>"]


# -- a small model written here, in each variant of the architecture ------------


def write_efml(
    folder: Path, word_dim: int = 6, char_dim: int = 5, seed: int = 0, legacy: bool = True
) -> Path:
    """An ELMoForManyLangs model folder with random weights, as the reference's
    training writes it (dictionaries with ids out of line order, a U+3000 line,
    the architecture named by an absolute path that does not exist)."""
    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.5

    filters = [[1, 4], [2, 6], [3, 6]]
    architecture = {
        "encoder": {
            "name": "elmo",
            "projection_dim": 8,
            "cell_clip": 3,
            "proj_clip": 3,
            "dim": 12,
            "n_layers": 2,
        },
        "token_embedder": {
            "name": "cnn",
            "activation": "relu",
            "filters": filters,
            "n_highway": 1,
            "word_dim": word_dim,
            "char_dim": char_dim,
            "max_characters_per_token": 10,
        },
        "classifier": {"name": "sampled_softmax", "n_samples": 10},
        "dropout": 0.1,
    }
    folder.mkdir(parents=True)
    (folder / "tiny.json").write_text(json.dumps(architecture))
    (folder / "config.json").write_text(json.dumps({"config_path": "/nowhere/tiny.json"}))
    embedder: dict[str, torch.Tensor] = {}
    if char_dim:
        chars = [
            "<oov>",
            "<pad>",
            "<bow>",
            "<eow>",
            "<bos>",
            "<eos>",
            *"Thebankrs.Zü北😀",
            "\u3000",
        ]
        chars = list(dict.fromkeys(chars))
        order = list(reversed(range(len(chars))))  # lines not in id order
        lines = [f"{chars[i]}\t{i}" if chars[i] != "\u3000" else f"\t{i}" for i in order]
        (folder / "char.dic").write_text("\n".join(lines) + "\n", encoding="utf-8")
        embedder["char_emb_layer.embedding.weight"] = random(len(chars), char_dim)
        for i, (width, n) in enumerate(filters):
            embedder[f"convolutions.{i}.weight"] = random(n, char_dim, width)
            embedder[f"convolutions.{i}.bias"] = random(n)
        embedder["highways._layers.0.weight"] = random(32, 16)
        embedder["highways._layers.0.bias"] = random(32)
    if word_dim:
        # "Supercal": the reference looks a long token up cut to max_chars - 2 characters
        words = ["<oov>", "<pad>", "<bos>", "<eos>", "The", "bank", "rates", ".", "<S>", "Supercal"]
        lines = [f"{w}\t{i}" for i, w in enumerate(words)]
        (folder / "word.dic").write_text("\n".join(lines[::-1]) + "\n", encoding="utf-8")
        embedder["word_emb_layer.embedding.weight"] = random(len(words), word_dim)
    width = word_dim + (16 if char_dim else 0)
    embedder["projection.weight"] = random(8, width)
    embedder["projection.bias"] = random(8)
    encoder = {}
    for direction in ("forward", "backward"):
        for layer in range(2):
            prefix = f"{direction}_layer_{layer}"
            encoder[f"{prefix}.input_linearity.weight"] = random(48, 8)
            encoder[f"{prefix}.state_linearity.weight"] = random(48, 8)
            encoder[f"{prefix}.state_linearity.bias"] = random(48)
            encoder[f"{prefix}.state_projection.weight"] = random(8, 12)
    for name, state in (("token_embedder.pkl", embedder), ("encoder.pkl", encoder)):
        torch.save(state, folder / name, _use_new_zipfile_serialization=not legacy)
    return folder


def reference_forward(folder: Path, tokens: list[str]) -> numpy.ndarray:
    """ELMoForManyLangs' forward pass for one sentence from zero state, its
    equations written out step by step: (3, n, 2P)."""
    architecture = json.loads((folder / "tiny.json").read_text())
    embedder = torch.load(folder / "token_embedder.pkl", weights_only=True)
    encoder = torch.load(folder / "encoder.pkl", weights_only=True)

    def dictionary(name: str) -> dict[str, int]:
        entries = {}
        for line in (folder / name).read_text(encoding="utf-8").splitlines():
            fields = line.strip().split("\t")
            token, index = fields if len(fields) == 2 else ("\u3000", fields[0])
            entries[token] = int(index)
        return entries

    max_chars = architecture["token_embedder"]["max_characters_per_token"]
    framed = ["<bos>", *(t[: max_chars - 2] for t in tokens), "<eos>"]
    parts = []
    if "word_emb_layer.embedding.weight" in embedder:
        words = dictionary("word.dic")
        ids = torch.tensor([words.get(t, words["<oov>"]) for t in framed])
        parts.append(embedder["word_emb_layer.embedding.weight"][ids])
    if "char_emb_layer.embedding.weight" in embedder:
        chars = dictionary("char.dic")
        ids = torch.full((len(framed), max_chars), chars["<pad>"])
        for j, token in enumerate(framed):
            row = (
                [chars[token]]
                if token in ("<bos>", "<eos>")
                else [chars.get(c, chars["<oov>"]) for c in token]
            )
            ids[j, : len(row) + 2] = torch.tensor([chars["<eow>"], *row, chars["<bow>"]])
        x = embedder["char_emb_layer.embedding.weight"][ids].transpose(1, 2)
        pooled = []
        for i in range(len(architecture["token_embedder"]["filters"])):
            y = nn.functional.conv1d(
                x, embedder[f"convolutions.{i}.weight"], embedder[f"convolutions.{i}.bias"]
            )
            pooled.append(torch.relu(y.max(dim=-1).values))
        h = torch.cat(pooled, dim=-1)
        for k in range(architecture["token_embedder"]["n_highway"]):
            w, b = embedder[f"highways._layers.{k}.weight"], embedder[f"highways._layers.{k}.bias"]
            nonlinear, gate = nn.functional.linear(h, w, b).chunk(2, dim=-1)
            gate = torch.sigmoid(gate)
            h = gate * h + (1 - gate) * torch.relu(nonlinear)
        parts.append(h)
    tokens_encoded = nn.functional.linear(
        torch.cat(parts, dim=-1), embedder["projection.weight"], embedder["projection.bias"]
    )

    def lstm(prefix: str, inputs: torch.Tensor) -> torch.Tensor:
        cell = architecture["encoder"]["dim"]
        h, c, outputs = torch.zeros(8), torch.zeros(cell), []
        for x in inputs:
            gates = (
                encoder[f"{prefix}.input_linearity.weight"] @ x
                + encoder[f"{prefix}.state_linearity.weight"] @ h
                + encoder[f"{prefix}.state_linearity.bias"]
            )
            i, f, g, o = gates.chunk(4)
            c = (torch.sigmoid(i) * torch.tanh(g) + torch.sigmoid(f) * c).clamp(-3, 3)
            h = encoder[f"{prefix}.state_projection.weight"] @ (torch.sigmoid(o) * torch.tanh(c))
            h = h.clamp(-3, 3)
            outputs.append(h)
        return torch.stack(outputs)

    layers = [torch.cat([tokens_encoded, tokens_encoded], dim=-1)]
    forward, backward = tokens_encoded, tokens_encoded.flip(0)
    for layer in range(2):
        new_forward = lstm(f"forward_layer_{layer}", forward)
        new_backward = lstm(f"backward_layer_{layer}", backward)
        if layer > 0:
            new_forward, new_backward = new_forward + forward, new_backward + backward
        forward, backward = new_forward, new_backward
        layers.append(torch.cat([forward, backward.flip(0)], dim=-1))
    return torch.stack(layers)[:, 1:-1].numpy()


@pytest.mark.parametrize(
    "word_dim,char_dim,encoder",
    [(6, 5, "word_char"), (0, 5, "char_cnn"), (6, 0, "word")],
    ids=["words and characters", "characters only", "words only"],
)
def test_each_variant_computes_the_reference_equations(tmp_path, word_dim, char_dim, encoder):
    folder = write_efml(tmp_path / "model", word_dim=word_dim, char_dim=char_dim)
    bilm = load_bilm(folder)
    assert bilm.config.encoder == encoder
    with torch.no_grad():
        together = bilm(bilm.batch(SENTENCES)).numpy()
    for i, tokens in enumerate(SENTENCES):
        expected = reference_forward(folder, tokens)
        numpy.testing.assert_allclose(together[:, i, : len(tokens)], expected, atol=2e-5)


def test_weights_in_torchs_zip_format_load_too(tmp_path):
    legacy = load_bilm(write_efml(tmp_path / "legacy"))
    current = load_bilm(write_efml(tmp_path / "zip", legacy=False))
    with torch.no_grad():
        torch.testing.assert_close(
            legacy(legacy.batch(SENTENCES)), current(current.batch(SENTENCES)), rtol=0, atol=0
        )


def test_convert_efml_writes_a_biLM_directory_that_computes_the_same(tmp_path):
    folder = write_efml(tmp_path / "model")
    result = CliRunner().invoke(app, ["convert-efml", str(folder), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "token encoder of words and characters" in result.output
    original, converted = read_efml(folder), load_bilm(tmp_path / "out")
    assert converted.char_vocab == original.char_vocab
    with torch.no_grad():
        torch.testing.assert_close(
            converted(converted.batch(SENTENCES)),
            original(original.batch(SENTENCES)),
            rtol=0,
            atol=0,
        )


def test_the_elmo_pipe_and_embed_read_the_model_folder_as_it_is(tmp_path):
    folder = write_efml(tmp_path / "model")
    bilm = read_efml(folder)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo").initialize(lambda: [], bilm_path=folder)
    doc = nlp("The bank raised rates .")
    with torch.no_grad():
        expected = bilm(bilm.batch([[t.text for t in doc]]))[:, 0].numpy()
    numpy.testing.assert_allclose(doc._.elmo, expected, atol=1e-6)
    nlp.to_disk(tmp_path / "pipeline")  # the character vocabulary travels with it
    numpy.testing.assert_array_equal(
        spacy.load(tmp_path / "pipeline")("The bank raised rates .")._.elmo, doc._.elmo
    )

    (tmp_path / "input.txt").write_text("The bank raised rates .\n", encoding="utf-8")
    output = tmp_path / "elmo.hdf5"
    result = CliRunner().invoke(
        app, ["embed", str(folder), str(tmp_path / "input.txt"), str(output)]
    )
    assert result.exit_code == 0, result.output
    with h5py.File(output, "r") as file:
        numpy.testing.assert_allclose(file["0"][...], expected, atol=1e-6)


def test_the_published_models_find_the_architecture_they_name(tmp_path):
    folder = write_efml(tmp_path / "model")
    (folder / "tiny.json").unlink()
    published = "/Users/someone/models/cnn_50_100_512_4096_sample.json"
    (folder / "config.json").write_text(json.dumps({"config_path": published}))
    # Found by name (the published architecture); the tiny weights then do not fit it.
    with pytest.raises(EfmlFormatError, match="does not match the model's architecture"):
        read_efml(folder)
    assert PUBLISHED_ARCHITECTURES["cnn_50_100_512_4096_sample.json"]["encoder"]["dim"] == 4096
    (folder / "config.json").write_text(json.dumps({"config_path": "other.json"}))
    with pytest.raises(EfmlFormatError, match="neither there nor in"):
        read_efml(folder)


# -- bad folders ------------------------------------------------------------------


class NotATensor:
    pass


def break_missing_file(folder: Path) -> str:
    (folder / "encoder.pkl").unlink()
    return "encoder.pkl is missing"


def break_dictionary(folder: Path) -> str:
    with (folder / "word.dic").open("a", encoding="utf-8") as file:
        file.write("extra\t10\n")
    return r"word.dic has 11 entries .* has 10 rows"


def break_architecture(folder: Path) -> str:
    architecture = json.loads((folder / "tiny.json").read_text())
    architecture["encoder"]["use_highway"] = True
    (folder / "tiny.json").write_text(json.dumps(architecture))
    return r"keys this converter does not know: \['encoder.use_highway'\]"


def break_weights_text(folder: Path) -> str:
    (folder / "token_embedder.pkl").write_text("not torch")
    return "token_embedder.pkl is not a torch weights file|token_embedder.pkl is not a file of"


def break_weights_object(folder: Path) -> str:
    with (folder / "encoder.pkl").open("wb") as file:
        pickle.dump({"weight": NotATensor()}, file, protocol=2)
    return "encoder.pkl is not a file of tensors that torch reads safely"


def break_weights_list(folder: Path) -> str:
    torch.save([torch.zeros(2)], folder / "encoder.pkl")
    return "encoder.pkl holds a list, not a state dict"


@pytest.mark.parametrize(
    "damage",
    [
        break_missing_file,
        break_dictionary,
        break_architecture,
        break_weights_text,
        break_weights_object,
        break_weights_list,
    ],
)
def test_a_bad_folder_is_refused_naming_the_file_and_nothing_is_written(tmp_path, damage):
    folder = write_efml(tmp_path / "model")
    message = damage(folder)
    with pytest.raises(EfmlFormatError, match=message):
        read_efml(folder)
    result = CliRunner().invoke(app, ["convert-efml", str(folder), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_model_folder_without_its_weights_says_what_is_missing(tmp_path):
    folder = write_efml(tmp_path / "model")
    shutil.copytree(folder, tmp_path / "copy")
    for name in ("token_embedder.pkl", "encoder.pkl"):
        (tmp_path / "copy" / name).unlink()
    result = CliRunner().invoke(app, ["convert-efml", str(tmp_path / "copy"), str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "incomplete ELMoForManyLangs model: token_embedder.pkl, encoder.pkl are" in result.output
    assert not (tmp_path / "o").exists()
