"""`elmo_spacy.Embedder` and `elmo-spacy embed`: the same vectors as the pipe,
AllenNLP's HDF5 layout, shards, DocBin output, and no half-written file."""

import json
import sys
from pathlib import Path

import h5py
import numpy
import pytest
import spacy
import torch
from spacy.tokens import Doc, DocBin
from typer.testing import CliRunner

import elmo_spacy
import elmo_spacy.bilm.runtime.precision as precision_module
import elmo_spacy.embedder
from elmo_spacy import Embedder
from elmo_spacy.bilm import BiLM, WordVocab, load_bilm, save_bilm
from elmo_spacy.bilm.formats.directory import BiLMLoadError
from elmo_spacy.bilm.runner import RunSettings
from elmo_spacy.cli import app

from .conftest import TINY_BILM

N_LAYERS, WIDTH = TINY_BILM.n_layers + 1, TINY_BILM.width
LINES = [
    "The bank raised interest rates on Monday .",
    "She sat on the bank of the river .",
    "",
    "Oil prices rose again .",
    "The bank raised interest rates on Monday .",  # a repeated sentence
    "A much longer line about the river bank " * 6,
    "Stocks fell .",
]


@pytest.fixture(scope="module")
def tiny_bilm_dir(tmp_path_factory) -> Path:
    """A biLM of random weights (TINY_BILM sizes), saved as a biLM directory."""
    torch.manual_seed(0)
    bilm = BiLM(TINY_BILM, WordVocab.specials_only(), with_softmax=False)
    return save_bilm(bilm, tmp_path_factory.mktemp("embed") / "bilm")


@pytest.fixture(scope="module")
def embedder(tiny_bilm_dir) -> Embedder:
    return Embedder(tiny_bilm_dir)


@pytest.fixture()
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def embed(*args: str):
    """Run `elmo-spacy embed ...` in this process."""
    return CliRunner().invoke(app, ["embed", *map(str, args)])


def elmo_pipe(bilm_dir: Path, **run):
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": {"run": run}}).initialize(lambda: [], bilm_path=bilm_dir)
    return nlp


# -- the Python API ------------------------------------------------------------


@pytest.mark.parametrize("layers", [None, [2, 0]])
def test_embedder_gives_the_pipes_vectors(tiny_bilm_dir, layers):
    nlp = elmo_pipe(tiny_bilm_dir, layers=layers)
    sentences = [line.split() for line in LINES]
    docs = list(nlp.pipe(Doc(nlp.vocab, words=tokens) for tokens in sentences))
    vectors = Embedder(tiny_bilm_dir, layers=layers).embed(sentences)
    assert len(vectors) == len(docs)
    for doc, array in zip(docs, vectors):
        assert array.dtype == numpy.float32
        assert array.shape == (len(layers or range(N_LAYERS)), len(doc), WIDTH)
        numpy.testing.assert_array_equal(array, doc._.elmo)


def test_embedder_keeps_the_order_and_embeds_each_sentence_alone(embedder):
    sentences = [line.split() for line in LINES]
    vectors = embedder.embed(sentences)
    assert [v.shape[1] for v in vectors] == [len(s) for s in sentences]
    assert vectors[2].shape == (N_LAYERS, 0, WIDTH)
    numpy.testing.assert_allclose(vectors[0], vectors[4], atol=1e-6)  # the repeated sentence
    for sentence, batched in zip(sentences, vectors):
        alone = embedder.embed_sentence(sentence)
        numpy.testing.assert_allclose(alone, batched, atol=1e-6)
    # Backwards and in small batches: the same vectors.
    small = Embedder(embedder.bilm, max_batch_tokens=8).embed(sentences[::-1])[::-1]
    for a, b in zip(small, vectors):
        numpy.testing.assert_allclose(a, b, atol=1e-6)


def test_embed_iter_yields_every_sentence_once_in_blocks(embedder):
    sentences = [line.split() for line in LINES]
    pairs = list(embedder.embed_iter(sentences, block_tokens=10))
    assert sorted(i for i, _ in pairs) == list(range(len(sentences)))
    lengths = [len(sentences[i]) for i, _ in pairs]
    assert lengths == sorted(lengths)  # shortest first
    expected = embedder.embed(sentences)
    for i, array in pairs:
        numpy.testing.assert_allclose(array, expected[i], atol=1e-6)


def test_embedder_refuses_what_it_cannot_embed(tiny_bilm_dir, embedder):
    with pytest.raises(ValueError, match="not a string"):
        embedder.embed("Oil prices rose .")
    with pytest.raises(ValueError, match="Sentence 1 is 'Oil prices rose .'"):
        embedder.embed([["Fine"], "Oil prices rose ."])
    with pytest.raises(ValueError, match=r"layers = \[0, 3\], but the biLM has 3 layers"):
        Embedder(tiny_bilm_dir, layers=[0, 3])
    with pytest.raises(ValueError, match="names a layer twice"):
        Embedder(tiny_bilm_dir, layers=[2, -1])
    with pytest.raises(ValueError, match="state = 'warm'"):
        Embedder(tiny_bilm_dir, state="warm")
    with pytest.raises(ValueError, match="window_overlap"):
        Embedder(tiny_bilm_dir, window=8, window_overlap=4)
    with pytest.raises(BiLMLoadError, match=str(tiny_bilm_dir.parent)):
        Embedder(tiny_bilm_dir.parent)
    with pytest.raises(ValueError, match="run.precision = 'int8'"):  # before loading
        Embedder(tiny_bilm_dir.parent / "missing", precision="int8")
    with pytest.raises(TypeError, match="windows"):
        Embedder(tiny_bilm_dir, windows=8)


def test_embedder_takes_run_settings_whole_or_as_keywords(tiny_bilm_dir):
    sentences = [["Oil", "prices", "rose", "."], ["Stocks", "fell"]]
    run = RunSettings(layers=[2, 0], state="primed", max_batch_tokens=4)
    whole = Embedder(tiny_bilm_dir, run)
    assert whole.runner.settings == run
    keywords = Embedder(tiny_bilm_dir, layers=[2, 0], state="primed", max_batch_tokens=4)
    for a, b in zip(whole.embed(sentences), keywords.embed(sentences)):
        numpy.testing.assert_array_equal(a, b)
    assert Embedder(tiny_bilm_dir, run, state="zero").runner.settings.state == "zero"


def test_embedder_keeps_the_precision_of_a_bilm_it_is_given(tiny_bilm_dir, monkeypatch):
    monkeypatch.setattr(precision_module, "bfloat16_unsupported", lambda device="cpu": None)
    bilm = load_bilm(tiny_bilm_dir)
    bilm.precision = "bfloat16"
    assert Embedder(bilm).bilm.precision == "bfloat16"
    assert Embedder(bilm, precision="float32").bilm.precision == "float32"
    assert Embedder(tiny_bilm_dir).bilm.precision == "float32"


def test_long_sentences_run_in_windows_with_the_pipes_vectors(tiny_bilm_dir):
    tokens = ("the river bank was full of water after the rain " * 5).split()
    windowed = Embedder(tiny_bilm_dir, window=16, window_overlap=4).embed_sentence(tokens)
    whole = Embedder(tiny_bilm_dir).embed_sentence(tokens)
    assert windowed.shape == whole.shape == (N_LAYERS, 50, WIDTH)
    numpy.testing.assert_allclose(windowed[0], whole[0], atol=1e-6)  # no context in layer 0
    assert not numpy.allclose(windowed[1:], whole[1:], atol=1e-4)  # but in the LSTM layers


# -- elmo-spacy embed ------------------------------------------------------------


def test_embed_writes_allennlps_layout(tiny_bilm_dir, embedder, corpus, tmp_path):
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.hdf5")
    assert result.exit_code == 0, result.output
    assert f"{len(LINES)} lines" in result.output and "tokens/s" in result.output
    expected = embedder.embed([line.split() for line in LINES])
    with h5py.File(tmp_path / "out.hdf5") as file:
        keys = {str(i) for i in range(len(LINES))}
        assert set(file.keys()) == keys | {"sentence_to_index"}
        for i, array in enumerate(expected):
            assert file[str(i)].dtype == numpy.float32
            numpy.testing.assert_allclose(file[str(i)][...], array, atol=1e-6)
        assert file["2"].shape == (N_LAYERS, 0, WIDTH)  # the empty line, kept
        index = json.loads(file["sentence_to_index"][0])
    # As AllenNLP writes it: stripped sentence -> key, a repeated sentence its last line.
    assert index[LINES[0]] == "4" and index[LINES[1]] == "1" and index[""] == "2"
    assert index[LINES[5].strip()] == "5"
    assert set(index.values()) == keys - {"0"}


@pytest.mark.parametrize(
    "flags, shape",
    [
        (["--top"], lambda n: (n, WIDTH)),
        (["--average"], lambda n: (n, WIDTH)),
        (["--all", "--layers", "2,0"], lambda n: (2, n, WIDTH)),
        (["--top", "--layers", "0,1"], lambda n: (n, WIDTH)),
    ],
)
def test_embed_top_average_and_layers(tiny_bilm_dir, embedder, corpus, tmp_path, flags, shape):
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.hdf5", *flags)
    assert result.exit_code == 0, result.output
    full = embedder.embed([line.split() for line in LINES])
    with h5py.File(tmp_path / "out.hdf5") as file:
        for i, layers in enumerate(full):
            written = file[str(i)][...]
            assert written.shape == shape(layers.shape[1])
            if flags == ["--top"]:
                expected = layers[-1]
            elif flags == ["--average"]:
                expected = layers.mean(axis=0)
            elif flags[0] == "--all":
                expected = layers[[2, 0]]
            else:
                expected = layers[1]  # the last of the kept layers
            numpy.testing.assert_allclose(written, expected, atol=1e-6)


def test_embed_with_sentence_keys(tiny_bilm_dir, embedder, tmp_path):
    lines = [line for i, line in enumerate(LINES) if i not in (2, 4)]  # no empty, no repeat
    corpus = tmp_path / "unique.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.hdf5", "--use-sentence-keys")
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "out.hdf5") as file:
        assert set(file.keys()) == {line.strip() for line in lines}  # no sentence_to_index
        numpy.testing.assert_allclose(
            file[lines[1]][...], embedder.embed_sentence(lines[1].split()), atol=1e-6
        )


def test_sentence_keys_refuse_repeats_and_empty_lines(tiny_bilm_dir, corpus, tmp_path):
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.hdf5", "--use-sentence-keys")
    assert result.exit_code == 1
    assert "Line 3 ('') cannot be an HDF5 key" in result.output
    corpus.write_text("Oil rose .\nOil fell .\nOil rose .\n", encoding="utf-8")
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.hdf5", "--use-sentence-keys")
    assert result.exit_code == 1 and "Lines 1 and 3 hold the same sentence" in result.output
    assert list(tmp_path.iterdir()) == [corpus]


def test_two_shards_cover_every_line_with_global_keys(tiny_bilm_dir, corpus, tmp_path):
    assert embed(tiny_bilm_dir, corpus, tmp_path / "all.hdf5").exit_code == 0
    for k in range(2):
        result = embed(tiny_bilm_dir, corpus, tmp_path / f"{k}.hdf5", "--part", f"{k}/2")
        assert result.exit_code == 0, result.output
    with (
        h5py.File(tmp_path / "all.hdf5") as whole,
        h5py.File(tmp_path / "0.hdf5") as even,
        h5py.File(tmp_path / "1.hdf5") as odd,
    ):
        assert set(even) - {"sentence_to_index"} == {"0", "2", "4", "6"}
        assert set(odd) - {"sentence_to_index"} == {"1", "3", "5"}
        for shard in (even, odd):
            for key in set(shard) - {"sentence_to_index"}:
                numpy.testing.assert_allclose(shard[key][...], whole[key][...], atol=1e-6)
        assert json.loads(odd["sentence_to_index"][0]) == {
            LINES[i].strip(): str(i) for i in (1, 3, 5)
        }


@pytest.mark.parametrize(
    "args, message",
    [
        (["--part", "2/2"], "--part 2/2: give K/N with 0 <= K < N"),
        (["--part", "a"], "--part a: give K/N"),
        (["--top", "--average"], "--top and --average: choose one"),
        (["--layers", "1;2"], "--layers 1;2: give layer indices separated by commas"),
        (["--layers", "5"], "layers = [5], but the biLM has 3 layers"),
        (["--state", "warm"], "state = 'warm': use one of"),
        (["--output-format", "npz"], "--output-format npz: use one of hdf5, spacy"),
        (["--gpu-id", "99"], "--gpu-id = 99 asks for a GPU"),
        (["--precision", "int8"], "run.precision = 'int8' is not a precision"),
    ],
)
def test_embed_errors_are_short_and_leave_no_file(tiny_bilm_dir, corpus, tmp_path, args, message):
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.hdf5", *args)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == [corpus]


def test_embed_refuses_to_overwrite_and_needs_its_input(tiny_bilm_dir, corpus, tmp_path):
    output = tmp_path / "out.hdf5"
    output.write_bytes(b"precious")
    result = embed(tiny_bilm_dir, corpus, output)
    assert result.exit_code == 1 and "exists: pass --overwrite" in result.output
    assert output.read_bytes() == b"precious"
    assert embed(tiny_bilm_dir, corpus, output, "--overwrite").exit_code == 0
    with h5py.File(output) as file:
        assert len(file) == len(LINES) + 1
    result = embed(tiny_bilm_dir, tmp_path / "missing.txt", tmp_path / "other.hdf5")
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.mark.parametrize("failure", [RuntimeError("out of memory"), KeyboardInterrupt()])
def test_a_failure_half_way_leaves_no_file(tiny_bilm_dir, corpus, tmp_path, monkeypatch, failure):
    real = Embedder.embed_iter

    def fail_after_one(self, sentences, **kwargs):
        iterator = real(self, sentences, **kwargs)
        yield next(iterator)
        raise failure

    monkeypatch.setattr(elmo_spacy.embedder.Embedder, "embed_iter", fail_after_one)
    output = tmp_path / "out.hdf5"
    output.write_bytes(b"precious")
    result = embed(tiny_bilm_dir, corpus, output, "--overwrite")
    assert result.exit_code != 0
    assert output.read_bytes() == b"precious"  # the old file, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "out.hdf5"]


@pytest.mark.parametrize("tokenize", [False, True])
def test_embed_to_a_docbin(tiny_bilm_dir, embedder, corpus, tmp_path, tokenize):
    flags = ["--output-format", "spacy"] + (["--tokenize"] if tokenize else [])
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.spacy", *flags)
    assert result.exit_code == 0, result.output
    nlp = spacy.blank("en")
    docs = list(DocBin().from_disk(tmp_path / "out.spacy").get_docs(nlp.vocab))
    assert len(docs) == len(LINES)
    for line, doc in zip(LINES, docs):
        tokens = [t.text for t in nlp(line.strip())] if tokenize else line.split()
        assert [t.text for t in doc] == tokens
        numpy.testing.assert_allclose(doc._.elmo, embedder.embed_sentence(tokens), atol=1e-6)
        assert doc.tensor.size == 0  # DocBin does not store the tensor
        elmo_spacy.restore_views(doc)
        assert doc.tensor.shape == (len(doc), WIDTH)
    assert [t.text for t in docs[0]][-2:] == ["Monday", "."]


def test_primed_state_through_the_command_line(tiny_bilm_dir, corpus, tmp_path):
    warmup = tmp_path / "warmup.txt"
    warmup.write_text("Markets were calm .\n\nTraders waited .\n", encoding="utf-8")
    result = embed(
        tiny_bilm_dir, corpus, tmp_path / "out.hdf5", "--state", "primed", "--warmup-file", warmup
    )
    assert result.exit_code == 0, result.output
    expected = Embedder(
        tiny_bilm_dir, state="primed", warmup=[["Markets", "were", "calm", "."], "Traders waited ."]
    ).embed_sentence(LINES[1].split())
    with h5py.File(tmp_path / "out.hdf5") as file:
        numpy.testing.assert_allclose(file["1"][...], expected, atol=1e-6)


def test_bfloat16_through_the_api_and_the_command_line(
    tiny_bilm_dir, corpus, tmp_path, monkeypatch
):
    # where the CPU lacks bfloat16 instructions torch emulates them: the same numbers, slower
    monkeypatch.setattr(precision_module, "bfloat16_unsupported", lambda device="cpu": None)
    sentences = [line.split() for line in LINES]
    nlp = elmo_pipe(tiny_bilm_dir, precision="bfloat16")
    docs = list(nlp.pipe(Doc(nlp.vocab, words=tokens) for tokens in sentences))
    vectors = Embedder(tiny_bilm_dir, precision="bfloat16").embed(sentences)
    exact = Embedder(tiny_bilm_dir).embed(sentences)
    for doc, array, float32 in zip(docs, vectors, exact):
        assert array.dtype == numpy.float32
        numpy.testing.assert_array_equal(array, doc._.elmo)
        numpy.testing.assert_allclose(
            array, float32, atol=0.05 * abs(float32).max(initial=0) + 1e-6
        )
    assert any(not numpy.array_equal(a, b) for a, b in zip(vectors, exact))
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.hdf5", "--precision", "bfloat16")
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "out.hdf5") as file:
        numpy.testing.assert_array_equal(file["1"][...], vectors[1])


def test_a_fall_back_under_the_command_line_is_one_line_not_typers(
    tiny_bilm_dir, corpus, tmp_path, monkeypatch
):
    monkeypatch.setattr(precision_module, "bfloat16_unsupported", lambda device="cpu": "no")
    result = embed(tiny_bilm_dir, corpus, tmp_path / "out.hdf5", "--precision", "bfloat16")
    assert result.exit_code == 0, result.output
    warning = "RuntimeWarning: run.precision = 'bfloat16' runs as 'float32': no."
    assert result.stderr.splitlines()[0] == warning  # then the progress bar
    assert "typer" not in result.stderr


# -- the output file's suffix chooses its format --------------------------------


def test_the_output_files_suffix_chooses_the_format(tiny_bilm_dir, embedder, corpus, tmp_path):
    assert embed(tiny_bilm_dir, corpus, tmp_path / "out.spacy").exit_code == 0
    docs = list(DocBin().from_disk(tmp_path / "out.spacy").get_docs(spacy.blank("en").vocab))
    numpy.testing.assert_allclose(
        docs[1]._.elmo, embedder.embed_sentence(LINES[1].split()), atol=1e-6
    )
    for name in ("out.h5", "out.HDF5", "out.vectors"):  # another suffix: the engine's, HDF5
        assert embed(tiny_bilm_dir, corpus, tmp_path / name).exit_code == 0
        with h5py.File(tmp_path / name) as file:
            assert len(file) == len(LINES) + 1
    assert (
        embed(tiny_bilm_dir, corpus, tmp_path / "docs.bin", "--output-format", "spacy").exit_code
        == 0
    )
    assert len(DocBin().from_disk(tmp_path / "docs.bin")) == len(LINES)


@pytest.mark.parametrize(
    "name, args, message",
    [
        (
            "out.parquet",
            [],
            "out.parquet names a Parquet file, which --engine ray writes: add --engine ray, or "
            "name it {tmp}/out.hdf5 (HDF5) or {tmp}/out.spacy (a DocBin)",
        ),
        (
            "out.hdf5",
            ["--output-format", "spacy"],
            "--output-format spacy writes a DocBin, but {tmp}/out.hdf5 names an HDF5 file "
            "(.hdf5): name it {tmp}/out.spacy, or drop --output-format to write HDF5",
        ),
        (
            "out.spacy",
            ["--output-format", "hdf5"],
            "out.spacy names a DocBin (.spacy): name it {tmp}/out.hdf5, or drop --output-format",
        ),
        (
            "out.hdf5",
            ["--engine", "ray"],
            "{tmp}/out.hdf5 names an HDF5 file (.hdf5), but --engine ray writes Parquet: name it "
            "{tmp}/out.parquet, or use --engine local to write HDF5",
        ),
        (
            "out.spacy",
            ["--engine", "ray", "--output-format", "parquet"],
            "names a DocBin (.spacy), but --engine ray writes Parquet: name it {tmp}/out.parquet",
        ),
        ("out.h5", ["--output-format", "csv"], "--output-format csv: use one of hdf5, spacy"),
    ],
)
def test_a_suffix_that_names_another_format_is_refused_before_anything_runs(
    tiny_bilm_dir, corpus, tmp_path, monkeypatch, name, args, message
):
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray would start
    result = embed(tiny_bilm_dir, corpus, tmp_path / name, *args)
    assert result.exit_code == 1
    assert message.format(tmp=tmp_path) in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == [corpus]


def test_ray_writes_parquet_into_a_file_of_another_suffix(
    tiny_bilm_dir, corpus, tmp_path, monkeypatch
):
    """With a suffix that names no format, --engine ray writes its Parquet
    (`embed_to_parquet` recorded here: no Ray starts)."""
    import elmo_spacy.ray_data

    calls = []
    monkeypatch.setattr(
        elmo_spacy.ray_data,
        "embed_to_parquet",
        lambda *args, **kwargs: calls.append(args) or (7, 42),
    )
    result = embed(tiny_bilm_dir, corpus, tmp_path / "vectors.out", "--engine", "ray")
    assert result.exit_code == 0, result.output
    assert calls[0][3] == tmp_path / "vectors.out"


def test_ray_takes_a_pair(corpus, tmp_path, monkeypatch):
    """The actors each load the two files: the pair reaches embed_to_parquet,
    and its actors' constructor as a list of two strings."""
    import elmo_spacy.ray_data
    from elmo_spacy.bilm.formats.bilm_tf import write_bilm_tf

    from .test_elmo_format import tiny_elmo

    options, weights = write_bilm_tf(tiny_elmo(), tmp_path / "tf")
    calls = []
    monkeypatch.setattr(
        elmo_spacy.ray_data,
        "embed_to_parquet",
        lambda *args, **kwargs: calls.append(args) or (7, 42),
    )
    result = embed(
        options, corpus, tmp_path / "out.parquet", "--engine", "ray", "--weight-file", weights
    )
    assert result.exit_code == 0, result.output
    assert calls[0][0] == (options, weights)
    assert elmo_spacy.ray_data._plain_path(calls[0][0]) == [str(options), str(weights)]
