"""`elmo-spacy export`: the biLM as ONNX and a torch.export program, run by
onnxruntime and torch against `Embedder` on the same tokens."""

import json

import numpy
import pytest
import torch

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab, load_bilm
from elmo_spacy.bilm.formats.exported import export_bilm, serving_inputs
from elmo_spacy.bilm.runner import Runner, RunSettings
from elmo_spacy.embedder import Embedder

from .conftest import ROOT, TINY_BILM, cli

ort = pytest.importorskip("onnxruntime", reason="onnxruntime runs the exported models")
BILM_TF = ROOT.parent / "shared" / "data" / "allennlp_elmo"
EFML = ROOT.parent / "shared" / "data" / "elmoformanylangs"
needs_bilm_tf = pytest.mark.skipif(
    not (BILM_TF / "lm_weights.hdf5").is_file(),
    reason=f"the reference ELMo fixtures are not at {BILM_TF} (see its README)",
)
needs_efml = pytest.mark.skipif(
    not (EFML / "outputs.hdf5").is_file(),
    reason=f"the ELMoForManyLangs fixtures are not at {EFML} (see its README)",
)
SENTENCES = [
    ["She", "sat", "on", "the", "bank", "of", "the", "river", "."],
    ["Markets", "rallied", "."],
    [],
    ["Antidisestablishmentarianism" * 2, "naïve", "café", "<S>", "€", "x"],
]
TOLERANCE = 1e-5


def tiny(encoder: str, clipped: bool) -> BiLM:
    torch.manual_seed(0)
    clips = {"cell_clip": 3.0 if clipped else None, "proj_clip": 3.0 if clipped else None}
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "encoder": encoder, "word_dim": 8, **clips})
    words = sorted({t for s in SENTENCES for t in s[:3]})
    bilm = BiLM(config, WordVocab.build([words], max_size=100, min_count=1), with_softmax=False)
    with torch.no_grad():
        for parameter in bilm.parameters():
            parameter.mul_(3.0)  # so that the clips bind
    return bilm.eval()


def onnx_layers(path, inputs: dict[str, numpy.ndarray]) -> list[numpy.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def per_sentence(layers: numpy.ndarray, sentences) -> list[numpy.ndarray]:
    return [layers[:, i, : len(s)] for i, s in enumerate(sentences)]


def assert_close(got: list[numpy.ndarray], expected: list[numpy.ndarray], tolerance=TOLERANCE):
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.shape == theirs.shape
        if mine.size:
            assert numpy.abs(mine - theirs).max() <= tolerance


@pytest.mark.parametrize(
    "encoder, clipped",
    [  # make test: the command's test (char_cnn, unclipped) and the published model (clipped)
        pytest.param("word_char", True, marks=pytest.mark.slow),
        pytest.param("char_cnn", True, marks=pytest.mark.slow),
        pytest.param("word", False, marks=pytest.mark.slow),
    ],
)
def test_each_encoder_exported_gives_what_embedder_gives(tmp_path, encoder, clipped):
    bilm = tiny(encoder, clipped)
    expected = Embedder(bilm).embed(SENTENCES)
    formats = ("onnx", "torch-export") if encoder == "word_char" else ("onnx",)
    export_bilm(bilm, tmp_path, formats=formats)
    inputs = serving_inputs(bilm, SENTENCES)
    (layers,) = onnx_layers(tmp_path / "bilm.onnx", inputs)
    assert_close(per_sentence(layers, SENTENCES), expected)
    other = [["Another", "batch", "of", "another", "size", "."]]  # the shapes are free
    (layers,) = onnx_layers(tmp_path / "bilm.onnx", serving_inputs(bilm, other))
    assert_close(per_sentence(layers, other), Embedder(bilm).embed(other))
    if "torch-export" in formats:
        program = torch.export.load(str(tmp_path / "bilm.pt2")).module()
        layers = program(*(torch.from_numpy(inputs[k]) for k in inputs)).detach().numpy()
        assert_close(per_sentence(layers, SENTENCES), expected)
    described = json.loads((tmp_path / "inputs.json").read_text())
    assert list(described["inputs"]) == list(inputs)
    assert (tmp_path / "vocab.txt").is_file() == (encoder != "char_cnn")


@needs_bilm_tf
def test_a_published_model_primed_exports_what_embedder_computes(tmp_path):
    bilm = load_bilm(BILM_TF)
    runner = Runner(bilm, RunSettings(state="primed"))
    export_bilm(bilm, tmp_path, formats=["onnx"], initial_states=runner.initial_states())
    sentences = [s for s in SENTENCES if s]
    (layers,) = onnx_layers(tmp_path / "bilm.onnx", serving_inputs(bilm, sentences))
    expected = Embedder(bilm, state="primed").embed(sentences)
    assert_close(per_sentence(layers, sentences), expected)
    assert not numpy.allclose(expected[0], Embedder(bilm).embed(sentences[:1])[0], atol=1e-3)


@needs_bilm_tf
@pytest.mark.slow
def test_a_stateful_replay_through_onnx_matches_the_reference(tmp_path):
    """bilm-tf's held-back outputs of ten batches, each starting from the
    states the previous one left: the states go in and out of the program."""
    import h5py

    bilm = load_bilm(BILM_TF)
    export_bilm(bilm, tmp_path, formats=["onnx"], with_states=True)
    sentences = json.loads((BILM_TF / "sentences.json").read_text())
    batches = [[sentences[k][i].split() for k in range(3)] for i in range(10)]
    inputs = serving_inputs(bilm, batches[0], with_states=True)
    h, c = inputs["initial_h"], inputs["initial_c"]
    worst = 0.0
    for i, batch in enumerate(batches):
        inputs = {**serving_inputs(bilm, batch), "initial_h": h, "initial_c": c}
        layers, h, c = onnx_layers(tmp_path / "bilm.onnx", inputs)
        for k in range(2):
            with h5py.File(BILM_TF / f"lm_embeddings_{k}.hdf5") as file:
                both = file[str(i)][...]
            reference = numpy.concatenate([both[0], both[1]], axis=1)
            worst = max(worst, float(numpy.abs(layers[-1, k, : len(batch[k])] - reference).max()))
    assert worst < TOLERANCE


@needs_efml
@pytest.mark.slow
def test_an_elmoformanylangs_model_exports_its_computation(tmp_path):
    """The fixture moves its top layer by up to 3e-4 for a one-ulp change of
    its input (see test_efml.py): onnxruntime's float32 arithmetic (its own
    tanh and sigmoid) moves it up to 1e-3 from what `Embedder` computes. In
    float64 (a torch.export program: onnxruntime has no float64 convolution
    on the CPU) the exported computation is the network's, to 1e-10."""
    bilm = load_bilm(EFML / "model")
    sentences = [s.split(" ") for s in json.loads((EFML / "sentences.json").read_text())]
    (tmp_path / "float32").mkdir()
    (tmp_path / "float64").mkdir()
    export_bilm(bilm, tmp_path / "float32", formats=["onnx"])
    inputs = serving_inputs(bilm, sentences)
    (layers,) = onnx_layers(tmp_path / "float32" / "bilm.onnx", inputs)
    expected = Embedder(bilm).embed(sentences)
    pairs = list(zip(per_sentence(layers, sentences), expected))
    gaps = [numpy.abs(ours - theirs) for ours, theirs in pairs]
    for gap, (_, theirs) in zip(gaps, pairs):  # the token encoding (values up to 519): rounding
        assert gap[0].max() <= 2e-6 * numpy.abs(theirs[0]).max()
    assert max(g.max() for g in gaps) <= 1e-3 and max(g.mean() for g in gaps) <= 1e-4
    export_bilm(bilm, tmp_path / "float64", formats=["torch-export"], dtype=torch.float64)
    program = torch.export.load(str(tmp_path / "float64" / "bilm.pt2")).module()
    wide = bilm.double()
    with torch.no_grad():
        layers = program(*(torch.from_numpy(inputs[k]) for k in inputs)).numpy()
        network = wide(wide.batch(sentences)).numpy()
    for ours, theirs in zip(per_sentence(layers, sentences), per_sentence(network, sentences)):
        assert numpy.abs(ours - theirs).max() < 1e-10


def test_the_export_command_writes_a_folder_and_refuses_what_it_cannot(bilm_dir, tmp_path):
    """The fixture biLM: a char CNN (masked ids), unclipped, primed."""
    result = cli("export", bilm_dir, tmp_path / "served", "--state", "primed")
    assert result.returncode == 0, result.stderr
    served = tmp_path / "served"
    assert sorted(p.name for p in served.iterdir()) == ["bilm.onnx", "bilm.pt2", "inputs.json"]
    described = json.loads((served / "inputs.json").read_text())
    assert described["state"] == "primed" and described["tokenization"]["tokenizer"] == "spacy"
    bilm = load_bilm(bilm_dir)
    assert bilm.config.encoder == "char_cnn" and not bilm.forward_lstm.clipped
    inputs = serving_inputs(bilm, SENTENCES)
    expected = Embedder(bilm, state="primed").embed(SENTENCES)
    (layers,) = onnx_layers(served / "bilm.onnx", inputs)
    assert_close(per_sentence(layers, SENTENCES), expected)
    program = torch.export.load(str(served / "bilm.pt2")).module()
    layers = program(*(torch.from_numpy(inputs[k]) for k in inputs)).detach().numpy()
    assert_close(per_sentence(layers, SENTENCES), expected)
    bad_format = cli("export", bilm_dir, tmp_path / "x", "--format", "tflite")
    assert bad_format.returncode != 0 and "--format tflite" in bad_format.stderr
    both = cli("export", bilm_dir, tmp_path / "x", "--with-states", "--state", "primed")
    assert both.returncode != 0 and "--with-states" in both.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # an export of its own (7 s)
def test_the_char_cnn_runs_once_per_distinct_token(tmp_path):
    """The inputs hold each distinct token's characters once and a row per
    position; the graph reads every position through its row, so that the
    same rows given twice over (a server that does not look for repeats)
    give the same layers."""
    bilm = tiny("char_cnn", True)
    export_bilm(bilm, tmp_path, formats=["onnx"])
    sentences = [["the", "cat", "saw", "the", "cat", "."], ["the", "."]]
    inputs = serving_inputs(bilm, sentences)
    assert inputs["char_ids"].shape[0] == 4 and inputs["type_ids"].shape == (2, 6)
    (layers,) = onnx_layers(tmp_path / "bilm.onnx", inputs)
    assert_close(per_sentence(layers, sentences), Embedder(bilm).embed(sentences))
    repeated = {**inputs, "type_ids": inputs["type_ids"].copy()}  # a row per position, reversed
    positions = [(i, j) for i, s in enumerate(sentences) for j in range(len(s))][::-1]
    repeated["char_ids"] = numpy.stack(
        [inputs["char_ids"][inputs["type_ids"][p]] for p in positions]
    )
    for row, p in enumerate(positions):
        repeated["type_ids"][p] = row
    (again,) = onnx_layers(tmp_path / "bilm.onnx", repeated)
    assert_close(per_sentence(again, sentences), per_sentence(layers, sentences))
    wider = dict(inputs)  # more columns than the batch needs: the same layers
    padding = numpy.full((4, 20 - inputs["char_ids"].shape[1]), bilm.chars.padding)
    wider["char_ids"] = numpy.concatenate([inputs["char_ids"], padding], axis=1)
    (same,) = onnx_layers(tmp_path / "bilm.onnx", wider)
    assert_close(per_sentence(same, sentences), per_sentence(layers, sentences))


def matmuls(graph) -> dict[str, int]:
    """The products of an ONNX graph and of its subgraphs (the scan's body),
    by operator."""
    import onnx

    counts: dict[str, int] = {}
    for node in graph.node:
        if "MatMul" in node.op_type or node.op_type == "Gemm":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                for op, n in matmuls(attribute.g).items():
                    counts[f"body {op}"] = counts.get(f"body {op}", 0) + n
    return counts


@pytest.mark.slow  # an int8 export of its own (6 s)
def test_an_int8_export_quantizes_every_product(tmp_path):
    """The tiny biLM's weights, scaled so that its clips bind, make it
    chaotic: int8 moves its layers by up to 10% of their largest value
    (the published model's figures: the next test)."""
    import onnx

    bilm = tiny("char_cnn", True)
    export_bilm(bilm, tmp_path, formats=["onnx"], quantize="int8")
    counts = matmuls(onnx.load(str(tmp_path / "bilm.onnx")).graph)
    # each layer's input products (both directions at once), the highway and projection, and per
    # step and direction the recurrent product and the projection: all int8, none in float32
    assert counts == {"MatMulInteger": 4, "body MatMulInteger": 8}, counts
    assert "int8" in json.loads((tmp_path / "inputs.json").read_text())["onnx_products"]
    (layers,) = onnx_layers(tmp_path / "bilm.onnx", serving_inputs(bilm, SENTENCES))
    pairs = [
        (a, b)
        for a, b in zip(per_sentence(layers, SENTENCES), Embedder(bilm).embed(SENTENCES))
        if b.size
    ]
    gaps = [numpy.abs(a - b).max(axis=(1, 2)) / numpy.abs(b).max(axis=(1, 2)) for a, b in pairs]
    assert max(g.max() for g in gaps) <= 0.15 and min(g.min() for g in gaps) > 1e-4


@needs_bilm_tf
@pytest.mark.slow
def test_a_published_model_in_int8_stays_within_its_reported_distance(tmp_path):
    """docs/results.md, "Serving outside Python": the int8 layers' distance
    from float32 on AG News sentences."""
    bilm = load_bilm(BILM_TF)
    export_bilm(bilm, tmp_path, formats=["onnx"], quantize="int8")
    lines = (ROOT / "tests" / "data" / "unlabeled.txt").read_text().splitlines()
    sentences = [line.split() for line in lines[:40] if line.split()]
    (layers,) = onnx_layers(tmp_path / "bilm.onnx", serving_inputs(bilm, sentences))
    expected = Embedder(bilm).embed(sentences)
    gaps = [numpy.abs(a - b) for a, b in zip(per_sentence(layers, sentences), expected)]
    for layer, (largest_gap, mean_gap) in enumerate(INT8_DISTANCE):
        assert max(g[layer].max() for g in gaps) <= largest_gap
        assert numpy.mean([g[layer].mean() for g in gaps]) <= mean_gap


# per layer: max and mean absolute difference, about twice what docs/results.md reports
INT8_DISTANCE = [(0.1, 0.01), (0.1, 0.01), (0.1, 0.01)]


@pytest.mark.slow  # an int8 export through the CLI (6 s)
def test_the_export_command_quantizes_to_int8_on_request(bilm_dir, tmp_path):
    served = tmp_path / "served"
    result = cli("export", bilm_dir, served, "--format", "onnx", "--quantize", "int8")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in served.iterdir()) == ["bilm.onnx", "inputs.json"]
    assert "int8" in json.loads((served / "inputs.json").read_text())["onnx_products"]
    bilm = load_bilm(bilm_dir)
    (layers,) = onnx_layers(served / "bilm.onnx", serving_inputs(bilm, SENTENCES))
    pairs = [
        (a, b)
        for a, b in zip(per_sentence(layers, SENTENCES), Embedder(bilm).embed(SENTENCES))
        if b.size
    ]
    gaps = [numpy.abs(a - b).max() / numpy.abs(b).max() for a, b in pairs]
    assert TOLERANCE < max(gaps) <= 0.05
    bad = cli("export", bilm_dir, tmp_path / "x", "--quantize", "int4")
    assert bad.returncode != 0 and "--quantize int4" in bad.stderr
    program_only = cli(
        "export", bilm_dir, tmp_path / "x", "--format", "torch-export", "--quantize", "int8"
    )
    assert program_only.returncode != 0 and "--format onnx" in program_only.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # an export of its own; embed tests the pair in the default run (7 s)
def test_export_takes_a_bilm_tf_pair_with_weight_file(tmp_path):
    """The options file as MODEL and --weight-file, apart and named
    otherwise: the exported model gives the layers Embedder gives from the
    folder of the two."""
    import shutil

    from typer.testing import CliRunner

    from elmo_spacy.bilm.formats.bilm_tf import write_bilm_tf
    from elmo_spacy.cli import app

    from .test_elmo_format import tiny_elmo

    folder = write_bilm_tf(tiny_elmo(), tmp_path / "tf")[0].parent
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    options = shutil.copyfile(folder / "options.json", tmp_path / "a" / "elmo_opts.json")
    weights = shutil.copyfile(folder / "weights.hdf5", tmp_path / "b" / "trained.h5")
    args = ["export", str(options), str(tmp_path / "served"), "--format", "onnx"]
    result = CliRunner().invoke(app, [*args, "--weight-file", str(weights)])
    assert result.exit_code == 0, result.output
    bilm = load_bilm(folder)
    (layers,) = onnx_layers(tmp_path / "served" / "bilm.onnx", serving_inputs(bilm, SENTENCES))
    assert_close(per_sentence(layers, SENTENCES), Embedder(folder).embed(SENTENCES))
    result = CliRunner().invoke(app, [*args[:2], str(tmp_path / "other")])
    assert result.exit_code == 1
    assert "is a bilm-tf options file, without its weights" in " ".join(result.output.split())
    assert not (tmp_path / "other").exists()


def test_export_into_an_earlier_export_needs_overwrite(tmp_path):
    from typer.testing import CliRunner

    from elmo_spacy.bilm.formats.bilm_tf import write_bilm_tf
    from elmo_spacy.cli import app

    from .test_elmo_format import tiny_elmo

    bilm_dir = write_bilm_tf(tiny_elmo(), tmp_path / "tf")[0].parent
    served = tmp_path / "served"
    served.mkdir()
    (served / "bilm.onnx").write_bytes(b"earlier")
    (served / "inputs.json").write_text("{}")
    result = CliRunner().invoke(app, ["export", str(bilm_dir), str(served), "--format", "onnx"])
    message = " ".join(result.output.split())
    assert result.exit_code == 1
    assert (
        f"{served} holds an earlier export (bilm.onnx, inputs.json): pass --overwrite to replace "
        "it, or name another folder" in message
    )
    assert (served / "bilm.onnx").read_bytes() == b"earlier"
    result = CliRunner().invoke(
        app, ["export", str(bilm_dir), str(served), "--format", "onnx", "--overwrite"]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in served.iterdir()) == ["bilm.onnx", "inputs.json"]
    assert (served / "bilm.onnx").read_bytes() != b"earlier"
