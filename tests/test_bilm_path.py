"""What `load_bilm`, `Embedder`, the `elmo` pipe's bilm_path and the commands
(`convert-elmo`, `embed`) accept: the layouts people download (published
bilm-tf files, AllenNLP's folder, NLPL's folders and .zip archives), a
bilm-tf model's two files as a pair, and what each wrong path says."""

import functools
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import h5py
import numpy
import pytest
import spacy
import torch
from typer.testing import CliRunner

from elmo_spacy.bilm import BiLM, load_bilm, save_bilm
from elmo_spacy.bilm.formats.bilm_tf import read_bilm_tf, write_bilm_tf
from elmo_spacy.bilm.formats.directory import BiLMLoadError
from elmo_spacy.bilm.formats.locate import BILM_DIR, BILM_TF, BILM_TF_ZIP, FORMATS, find_bilm
from elmo_spacy.cli import app

from .conftest import tokenize
from .test_elmo_format import FIXTURES, tiny_elmo

SENTENCES = tokenize(["The bank raised rates on Monday .", "She sat by the river bank ."])
# What else the archives and folders people download hold, besides the two files.
NLPL_EXTRAS = {"README": "An ELMo model.\n", "meta.json": '{"id": 209}', "vocab.txt": "the\nbank\n"}


@pytest.fixture(params=["tiny", "allennlp"])
def source(request, tmp_path_factory) -> tuple[Path, Path]:
    """The (options, weights) files of a bilm-tf model: a tiny random biLM
    exported here, or AllenNLP's test fixture where ../shared/data holds it."""
    if request.param == "allennlp":
        if not (FIXTURES / "lm_weights.hdf5").is_file():
            pytest.skip(f"the AllenNLP ELMo fixtures are not at {FIXTURES} (not shipped)")
        return FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5"
    return write_bilm_tf(tiny_elmo(), tmp_path_factory.mktemp("tiny") / "tf")


def outputs(bilm: BiLM) -> torch.Tensor:
    with torch.inference_mode():
        return bilm(bilm.batch(SENTENCES))


def folder_of(path: Path, files: dict[str, Path | str]) -> Path:
    """A folder holding copies of files (Path) and small text files (str)."""
    path.mkdir(parents=True)
    for name, content in files.items():
        if isinstance(content, Path):
            shutil.copyfile(content, path / name)
        else:
            (path / name).write_text(content)
    return path


def zip_of(path: Path, members: dict[str, Path | str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            if isinstance(content, Path):
                archive.write(content, name)
            else:
                archive.writestr(name, content)
    return path


def embeddings_file(path: Path) -> Path:
    """An HDF5 file of activations, as AllenNLP's fixture folder holds beside the weights."""
    with h5py.File(path, "w") as file:
        file["0"] = numpy.zeros((2, 3, 16), dtype="float32")
    return path


def assert_loads_as(path: Path, source: tuple[Path, Path], kind: str) -> None:
    assert find_bilm(path)[0] == kind
    assert torch.equal(outputs(load_bilm(path)), outputs(read_bilm_tf(*source)))


# -- accepted ------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, weights",
    [
        ("options.json", "weights.hdf5"),
        (
            "elmo_2x1024_128_2048cnn_1xhighway_options.json",
            "elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5",
        ),
        ("options.json", "model.hdf5"),  # NLPL, unpacked
        ("elmo_options.json", "my-elmo.h5"),  # any names
    ],
)
def test_each_folder_layout_loads_as_the_converted_model(tmp_path, source, options, weights):
    folder = folder_of(tmp_path / "model", {options: source[0], weights: source[1], **NLPL_EXTRAS})
    assert_loads_as(folder, source, BILM_TF)


def test_an_allennlp_folder_with_other_json_and_hdf5_files_loads(tmp_path, source):
    folder = folder_of(
        tmp_path / "allennlp",
        {"options.json": source[0], "lm_weights.hdf5": source[1], "sentences.json": "[[]]"},
    )
    embeddings_file(folder / "lm_embeddings_0.hdf5")
    embeddings_file(folder / "lm_embeddings_1.hdf5")
    assert find_bilm(folder) == (BILM_TF, (folder / "options.json", folder / "lm_weights.hdf5"))
    assert_loads_as(folder, source, BILM_TF)


def test_the_fixture_folder_itself_loads():
    if not (FIXTURES / "lm_weights.hdf5").is_file():
        pytest.skip(f"the AllenNLP ELMo fixtures are not at {FIXTURES} (not shipped)")
    source = FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5"
    assert_loads_as(FIXTURES, source, BILM_TF)


@pytest.mark.parametrize("prefix", ["", "209/"])
def test_an_nlpl_zip_loads_from_its_top_level_or_one_subfolder(
    tmp_path, source, prefix, monkeypatch
):
    members = {"options.json": source[0], "model.hdf5": source[1], **NLPL_EXTRAS}
    archive = zip_of(tmp_path / "209.zip", {prefix + k: v for k, v in members.items()})
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    found = (archive, prefix + "options.json", prefix + "model.hdf5")
    assert find_bilm(archive) == (BILM_TF_ZIP, found)
    assert_loads_as(archive, source, BILM_TF_ZIP)
    assert list(temporary.iterdir()) == []  # the extracted members are removed


def test_a_zip_with_an_allennlp_pair_of_any_names_loads(tmp_path, source):
    archive = zip_of(
        tmp_path / "elmo.zip",
        {"elmo/elmo_options.json": source[0], "elmo/lm_weights.hdf5": source[1], "README": "x"},
    )
    assert_loads_as(archive, source, BILM_TF_ZIP)


def test_a_biLM_directory_is_still_a_biLM_directory(tmp_path, source):
    save_bilm(read_bilm_tf(*source), tmp_path / "bilm")
    assert_loads_as(tmp_path / "bilm", source, BILM_DIR)


def test_the_pipe_initialises_from_an_allennlp_folder(tmp_path, source):
    folder = folder_of(tmp_path / "elmo", {"options.json": source[0], "lm_weights.hdf5": source[1]})
    embeddings_file(folder / "lm_embeddings_0.hdf5")
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    nlp.config["initialize"]["components"]["elmo"] = {"bilm_path": str(folder)}
    nlp.initialize()
    doc = nlp(" ".join(SENTENCES[0]))
    assert [t.text for t in doc] == SENTENCES[0]
    expected = outputs(read_bilm_tf(*source))[:, 0, : len(doc)].numpy()
    assert doc._.elmo.shape == expected.shape
    assert numpy.allclose(doc._.elmo, expected, atol=1e-6)


# -- convert-elmo --------------------------------------------------------------


def convert(*args: Path):
    return CliRunner().invoke(app, ["convert-elmo", *map(str, args)])


def test_convert_elmo_takes_a_folder_a_zip_or_the_two_files(tmp_path, source):
    folder = folder_of(
        tmp_path / "allennlp", {"options.json": source[0], "lm_weights.hdf5": source[1]}
    )
    archive = zip_of(
        tmp_path / "nlpl.zip",
        {"sub/options.json": source[0], "sub/model.hdf5": source[1], **NLPL_EXTRAS},
    )
    expected = outputs(read_bilm_tf(*source))
    for name, inputs in [("folder", [folder]), ("zip", [archive]), ("pair", list(source))]:
        result = convert(*inputs, tmp_path / name)
        assert result.exit_code == 0, result.output
        assert str(inputs[0]) in result.output
        assert torch.equal(outputs(load_bilm(tmp_path / name)), expected), name


def test_convert_elmo_says_what_is_wrong(tmp_path, source):
    result = convert(tmp_path / "nowhere", tmp_path / "out")
    assert result.exit_code == 1 and "does not exist" in result.output
    result = convert(source[0], tmp_path / "out")
    assert result.exit_code == 1 and "is a bilm-tf options file, without its weights" in " ".join(
        result.output.split()
    )
    result = convert(source[0], source[1].parent, tmp_path / "out")
    assert result.exit_code == 1 and "is a folder" in result.output
    result = convert(source[0], source[1], tmp_path / "a", tmp_path / "out")
    assert result.exit_code == 2 and "got 4 paths" in result.output
    save_bilm(read_bilm_tf(*source), tmp_path / "bilm")
    result = convert(tmp_path / "bilm", tmp_path / "out")
    assert result.exit_code == 1 and "already a biLM directory" in result.output
    assert not (tmp_path / "out").exists()


# -- refused, saying why -------------------------------------------------------


def refusal(path: Path, **kwargs) -> str:
    with pytest.raises(BiLMLoadError) as error:
        load_bilm(path, **kwargs)
    return " ".join(str(error.value).split())


def test_a_path_that_does_not_exist_names_the_closest(tmp_path):
    (tmp_path / "elmo_model").mkdir()
    message = refusal(tmp_path / "elmo_modle")
    assert f"{tmp_path / 'elmo_modle'} does not exist" in message
    assert f"Did you mean {tmp_path / 'elmo_model'}?" in message
    message = refusal(tmp_path / "elmo_modle" / "model-best")
    assert f"{tmp_path} has no elmo_modle" in message and "Did you mean" in message


def test_a_pretraining_output_folder_points_to_model_best(tmp_path, source):
    bilm = read_bilm_tf(*source)
    for name in ("model-best", "model-last", "checkpoint-40"):
        save_bilm(bilm, tmp_path / "pretrained" / name)
    (tmp_path / "pretrained" / "latest-checkpoint").write_text("checkpoint-40\n")
    message = refusal(tmp_path / "pretrained")
    assert "output folder of `elmo-spacy pretrain`" in message
    assert f"point to its model-best, {tmp_path / 'pretrained' / 'model-best'}" in message
    assert load_bilm(tmp_path / "pretrained" / "model-best").config == bilm.config
    shutil.rmtree(tmp_path / "pretrained" / "model-best")
    assert "point to its model-last" in refusal(tmp_path / "pretrained")
    shutil.rmtree(tmp_path / "pretrained" / "model-last")
    assert "latest checkpoint (checkpoint-40)" in refusal(tmp_path / "pretrained")


def test_a_folder_of_nothing_known_lists_the_layouts_and_what_it_holds(tmp_path, source):
    folder = folder_of(
        tmp_path / "downloads",
        {"notes.txt": "hello", "data.json": "[1, 2]", "other.json": '{"lstm_size": 3}'},
    )
    embeddings_file(folder / "activations.hdf5")
    message = refusal(folder)
    assert f"{folder} holds no biLM" in message
    for layout in (
        "config.json + vocab.json + weights.safetensors",
        "options.json + weights.hdf5",
        "<name>_options.json",
        "lm_weights.hdf5",
        "options.json + model.hdf5",
        ".zip",
    ):
        assert layout in message
    assert "It holds: activations.hdf5, data.json, notes.txt, other.json." in message
    # A model one level down is named.
    folder_of(folder / "elmo", {"options.json": source[0], "weights.hdf5": source[1]})
    assert f"Point to {folder / 'elmo'}, which holds one" in refusal(folder)


def test_an_incomplete_biLM_directory_names_the_missing_file(tmp_path, source):
    path = save_bilm(read_bilm_tf(*source), tmp_path / "bilm")
    (path / "vocab.json").unlink()
    message = refusal(path)
    assert "incomplete biLM directory: vocab.json is missing" in message


@pytest.mark.parametrize(
    "names",
    [
        ("a_options.json", "a_weights.hdf5", "b_options.json", "b_weights.hdf5"),
        ("options.json", "weights.hdf5", "options.json", "model.hdf5"),
        ("small.json", "elmo.hdf5", "medium.json", "elmo.hdf5"),  # by content: two options files
    ],
)
def test_two_candidate_models_are_named(tmp_path, source, names):
    files = {name: source[i % 2] for i, name in enumerate(names)}
    message = refusal(folder_of(tmp_path / "two", files))
    assert "more than one candidate bilm-tf model" in message
    assert f"{names[0]} + {names[1]}" in message and f"{names[2]} + {names[3]}" in message


def test_a_zip_with_two_models_or_none_says_so(tmp_path, source):
    two = zip_of(
        tmp_path / "two.zip",
        {f"{d}/{n}": f for d in ("x", "y") for n, f in zip(("options.json", "model.hdf5"), source)},
    )
    message = refusal(two)
    assert "more than one folder (x/, y/)" in message
    message = refusal(zip_of(tmp_path / "none.zip", {"README": "x", "meta.json": "{}"}))
    assert "holds no bilm-tf model" in message and "It holds: README, meta.json." in message
    (tmp_path / "broken.zip").write_bytes(b"PK\x03\x04 not really")
    assert "not a readable zip archive" in refusal(tmp_path / "broken.zip")


def test_a_file_that_is_not_a_zip_says_a_biLM_is_a_folder(tmp_path, source):
    (tmp_path / "model.tar.gz").write_bytes(b"\x1f\x8b not a zip")
    message = refusal(tmp_path / "model.tar.gz")
    assert "is a file, not a biLM: a biLM path is a folder, or an NLPL ELMo .zip" in message
    folder = folder_of(tmp_path / "pair", {"options.json": source[0], "weights.hdf5": source[1]})
    assert f"Or point to the folder that holds it, {folder}." in refusal(folder / "weights.hdf5")


def test_a_bilm_tf_model_has_no_softmax_to_load(tmp_path, source):
    folder = folder_of(tmp_path / "pair", {"options.json": source[0], "weights.hdf5": source[1]})
    assert "has no softmax head" in refusal(folder, with_softmax=True)


def test_errors_in_a_zipped_model_name_the_member(tmp_path, source):
    options = json.loads(source[0].read_text())
    options["lstm"]["use_peepholes"] = True
    archive = zip_of(
        tmp_path / "bad.zip", {"m/options.json": json.dumps(options), "m/model.hdf5": source[1]}
    )
    with pytest.raises(ValueError, match="use_peepholes") as error:
        load_bilm(archive)
    assert f"{archive}:m/options.json" in str(error.value)


def test_convert_elmo_into_a_folder_of_other_files_says_what_is_there_and_what_to_do(
    tmp_path, source
):
    (tmp_path / "out" / "runs").mkdir(parents=True)
    (tmp_path / "out" / "notes.txt").write_text("mine")
    result = convert(*source, tmp_path / "out")
    message = " ".join(result.output.split())
    assert result.exit_code == 1, message
    assert f"{tmp_path / 'out'} already holds notes.txt, runs/, which are not part of" in message
    assert "they would be deleted: choose another output folder (a new or empty one)" in message
    assert f"or move them out of {tmp_path / 'out'} first" in message
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("mine")
    result = convert(*source, tmp_path / "file")
    assert result.exit_code == 1
    assert f"{tmp_path / 'file'} is a file, not a folder" in " ".join(result.output.split())
    assert (tmp_path / "file").read_text() == "mine"
    (tmp_path / "out" / "notes.txt").unlink()
    (tmp_path / "out" / "runs").rmdir()
    assert convert(*source, tmp_path / "out").exit_code == 0  # an empty folder is fine


def test_every_format_is_offered_in_the_commands_help():
    for command in ("embed", "export"):
        help_text = " ".join(CliRunner().invoke(app, [command, "--help"]).output.split())
        help_text = help_text.replace("│", "").replace("  ", " ")
        for format in FORMATS.values():
            assert " ".join(format.name.split()) in " ".join(help_text.split()), (command, format)


def test_shapes_are_checked_one_way_for_every_format():
    from elmo_spacy.bilm.formats.checks import check_shapes
    from elmo_spacy.errors import ElmoSpacyError

    expected = {"a": (2, -1), "b": (3,)}
    with_extra = {"a": (2, 7), "b": (3,), "c": (1,)}
    check = functools.partial(
        check_shapes, expected=expected, where="f", described_by="d", error=ElmoSpacyError
    )
    check(with_extra)
    with pytest.raises(ElmoSpacyError, match=r"f does not match d \(unexpected c\)"):
        check(with_extra, unexpected=True)
    with pytest.raises(
        ElmoSpacyError, match=r"missing b; a has shape \(3, 7\) where d calls for \(2, 'any'\)"
    ):
        check({"a": (3, 7)})


# -- a bilm-tf model's two files as a pair -------------------------------------


def pair_apart(tmp_path: Path, source: tuple[Path, Path]) -> tuple[Path, Path]:
    """The two files in different folders, under names no folder search would
    pair: how AllenNLP users hold a published model."""
    options = tmp_path / "downloads" / "elmo_small_opts.json"
    weights = tmp_path / "weights" / "2019" / "trained.h5"
    for copy, original in ((options, source[0]), (weights, source[1])):
        copy.parent.mkdir(parents=True)
        shutil.copyfile(original, copy)
    return options, weights


def folder_form(tmp_path: Path, source: tuple[Path, Path]) -> Path:
    return folder_of(tmp_path / "folder", {"options.json": source[0], "weights.hdf5": source[1]})


def test_load_bilm_takes_the_pair_as_a_tuple_or_list_of_paths_or_strings(tmp_path, source):
    options, weights = pair_apart(tmp_path, source)
    expected = outputs(load_bilm(folder_form(tmp_path, source)))
    for pair in [(options, weights), [str(options), str(weights)], (str(options), weights)]:
        assert torch.equal(outputs(load_bilm(pair)), expected), pair


def test_embedder_takes_the_pair(tmp_path, source):
    from elmo_spacy import Embedder

    pair = pair_apart(tmp_path, source)
    expected = Embedder(folder_form(tmp_path, source)).embed(SENTENCES)
    for got, want in zip(Embedder(pair).embed(SENTENCES), expected, strict=True):
        assert numpy.array_equal(got, want)


def test_embed_takes_the_options_file_and_weight_file(tmp_path, source):
    options, weights = pair_apart(tmp_path, source)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(s) for s in SENTENCES) + "\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "embed",
            str(options),
            str(corpus),
            str(tmp_path / "pair.hdf5"),
            "--weight-file",
            str(weights),
        ],
    )
    assert result.exit_code == 0, result.output
    folder = folder_form(tmp_path, source)
    result = runner.invoke(app, ["embed", str(folder), str(corpus), str(tmp_path / "folder.hdf5")])
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "pair.hdf5") as pair, h5py.File(tmp_path / "folder.hdf5") as whole:
        assert set(pair) == set(whole) == {"0", "1", "sentence_to_index"}
        for key in ("0", "1"):
            assert numpy.array_equal(pair[key][...], whole[key][...])
    result = runner.invoke(
        app,
        [
            "embed",
            str(options),
            str(corpus),
            str(tmp_path / "x.hdf5"),
            "--weight-file",
            str(weights.parent / "trained.hdf5"),
        ],
    )
    message = " ".join(result.output.split())
    assert result.exit_code == 1 and "The weights file of the bilm-tf pair" in message
    assert f"{weights.parent / 'trained.hdf5'} does not exist" in message
    assert f"Did you mean {weights}?" in message
    result = runner.invoke(app, ["embed", str(options), str(corpus), str(tmp_path / "x.hdf5")])
    message = " ".join(result.output.split())
    assert result.exit_code == 1 and "is a bilm-tf options file, without its weights" in message
    assert "--weight-file WEIGHTS_HDF5" in message
    assert not (tmp_path / "x.hdf5").exists()


PAIR_PREDICT = """
import json, sys, numpy, spacy
nlp = spacy.load(sys.argv[1])
for i, doc in enumerate(nlp.pipe(json.loads(sys.argv[2]))):
    numpy.save(f"{sys.argv[1]}-{i}-elmo.npy", doc._.elmo)
    numpy.save(f"{sys.argv[1]}-{i}-tensor.npy", doc.tensor)
"""


def pipeline_of_a_pair(pair: list[str]):
    """An elmo pipe whose [initialize] bilm_path is `pair`, and a tok2vec pipe
    (ElmoTok2Vec.v1, owning its biLM) whose model block's bilm_path is `pair`,
    initialised."""
    from spacy.tokens import Doc
    from spacy.training import Example

    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    tok2vec = {
        "@architectures": "elmo_spacy.ElmoTok2Vec.v1",
        "bilm": {"@architectures": "elmo_spacy.ElmoBiLM.v1"},
        "mix": {"@architectures": "elmo_spacy.ScalarMix.v1"},
        "width": 8,
        "bilm_path": pair,
    }
    nlp.add_pipe("tok2vec", config={"model": tok2vec})
    nlp.config["initialize"]["components"]["elmo"] = {"bilm_path": pair}
    doc = Doc(nlp.vocab, words=SENTENCES[0])
    nlp.initialize(lambda: [Example(doc, doc)])
    return nlp


def test_the_pipe_and_its_own_tok2vec_take_the_pair_in_a_config_and_save_the_biLM_inside(
    tmp_path, source
):
    """bilm_path = [options, weights] for the elmo pipe ([initialize]) and for
    an ElmoTok2Vec.v1 that owns its biLM (its model block): both read the
    pair as the folder, and the saved pipeline carries the biLM: it loads
    with the two files gone."""
    from elmo_spacy.layers import get_bilm

    options, weights = pair_apart(tmp_path, source)
    pair = [str(options), str(weights)]
    nlp = pipeline_of_a_pair(pair)
    from_folder = spacy.blank("en")
    from_folder.add_pipe("elmo").initialize(lambda: [], bilm_path=folder_form(tmp_path, source))
    texts = [" ".join(s) for s in SENTENCES]
    docs = list(nlp.pipe(texts))
    for ours, theirs in zip(docs, from_folder.pipe(texts), strict=True):
        assert numpy.array_equal(ours._.elmo, theirs._.elmo)
    folder_bilm = get_bilm(from_folder.get_pipe("elmo").model).state_dict()
    model = nlp.get_pipe("tok2vec").model
    owned = [node for node in model.walk() if node.name == "elmo_inline_bilm"]
    owned_bilm = get_bilm(owned[0].layers[0]).state_dict()
    assert owned_bilm.keys() == folder_bilm.keys()
    assert all(torch.equal(owned_bilm[k], folder_bilm[k]) for k in folder_bilm)

    nlp.to_disk(tmp_path / "pipeline")
    saved = spacy.util.load_config(tmp_path / "pipeline" / "config.cfg")
    assert saved["initialize"]["components"]["elmo"]["bilm_path"] == pair
    assert saved["components"]["tok2vec"]["model"]["bilm_path"] == pair
    shutil.rmtree(tmp_path / "downloads")
    shutil.rmtree(tmp_path / "weights")
    loaded = spacy.load(tmp_path / "pipeline")
    for doc, again in zip(docs, loaded.pipe(texts), strict=True):
        assert numpy.array_equal(doc._.elmo, again._.elmo)
        assert numpy.array_equal(doc.tensor, again.tensor)


@pytest.mark.slow  # a process of its own: about 8 s
def test_a_pipeline_initialised_from_a_pair_loads_in_a_fresh_process(tmp_path):
    """What the test above shows in this process, by `spacy.load` in a new one."""
    options, weights = pair_apart(tmp_path, write_bilm_tf(tiny_elmo(), tmp_path / "tf"))
    nlp = pipeline_of_a_pair([str(options), str(weights)])
    texts = [" ".join(s) for s in SENTENCES]
    docs = list(nlp.pipe(texts))
    path = str(tmp_path / "pipeline")
    nlp.to_disk(path)
    shutil.rmtree(tmp_path / "downloads")
    shutil.rmtree(tmp_path / "weights")
    result = subprocess.run(
        [sys.executable, "-c", PAIR_PREDICT, path, json.dumps(texts)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for i, doc in enumerate(docs):
        assert numpy.load(f"{path}-{i}-elmo.npy").tobytes() == doc._.elmo.tobytes()
        assert numpy.load(f"{path}-{i}-tensor.npy").tobytes() == doc.tensor.tobytes()


def test_a_pair_that_is_not_one_says_what_is_wrong(tmp_path, source):
    options, weights = pair_apart(tmp_path, source)
    missing = options.with_name("elmo_small_options.json")
    message = refusal((missing, weights))
    assert (
        f"The options file of the bilm-tf pair (OPTIONS_JSON, WEIGHTS_HDF5): {missing} does not exist"
        in message
    )
    assert f"Did you mean {options}?" in message
    message = refusal((options, tmp_path / "weights" / "2019" / "trained.hdf5"))
    assert "The weights file of the bilm-tf pair" in message and "does not exist" in message
    assert "is a folder" in refusal((options, weights.parent))
    assert "the wrong way round" in refusal((weights, options))
    assert "holds 3 paths" in refusal([options, weights, weights])
    assert "holds 1 path:" in refusal([options])
    assert "is of type int" in refusal(3)
    message = refusal(options)
    assert f"{options} is a bilm-tf options file, without its weights" in message
    assert "load_bilm((OPTIONS_JSON, WEIGHTS_HDF5))" in message
    assert 'bilm_path = ["OPTIONS_JSON", "WEIGHTS_HDF5"]' in message
    message = refusal(weights)
    assert f"{weights} holds a bilm-tf model's weights, without its options" in message
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    nlp.config["initialize"]["components"]["elmo"] = {"bilm_path": [str(options)]}
    with pytest.raises(BiLMLoadError, match="holds 1 path"):
        nlp.initialize()
