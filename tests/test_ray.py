"""Ray Data (`elmo_spacy.ray_data`, `elmo-spacy embed --engine ray`): the
callable classes give `Embedder`'s vectors and `nlp.pipe`'s annotations bit
for bit, through actors on a local Ray instance started once for the file; a
killed actor loses no line and writes none twice; a missing Ray names the
extra that brings it."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import h5py
import numpy
import pyarrow
import pyarrow.parquet
import pytest
import spacy
import torch
from spacy.tokens import Doc, DocBin
from spacy.training import Example

from elmo_spacy import Embedder, ray_data
from elmo_spacy.bilm import BiLM, WordVocab, save_bilm
from elmo_spacy.bilm.inputs.tokenization import Tokenization
from elmo_spacy.bilm.runner import RunSettings
from elmo_spacy.ray_data import AnnotateBatches, EmbedBatches, tensors_to_numpy

from .conftest import TINY_BILM, cli

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed: pip install elmo_spacy[ray]",
)
N_LAYERS, WIDTH = TINY_BILM.n_layers + 1, TINY_BILM.width
TEXTS = [
    "Oil prices rose again, Reuters said.",
    "",
    "Teams in China won't play tonight.",
    "Stocks fell .",
    "A much longer line about the river bank and the interest rates of banks " * 3,
    "Oil prices rose again, Reuters said.",  # a repeated line
]
CORPUS = [f"{text} {i}" if text else "" for i in range(4) for text in TEXTS]  # 24 lines


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray for every test of the file (it takes seconds to start)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def spacy_bilm(tmp_path_factory) -> Path:
    """A biLM of random weights that records spaCy's English tokenizer."""
    torch.manual_seed(0)
    bilm = BiLM(
        TINY_BILM,
        WordVocab.specials_only(),
        with_softmax=False,
        tokenization=Tokenization("spacy", "en"),
    )
    return save_bilm(bilm, tmp_path_factory.mktemp("ray") / "bilm")


def spacy_tokens(texts: list[str]) -> list[list[str]]:
    tokenizer = spacy.blank("en").tokenizer
    return [[t.text for t in tokenizer(text)] for text in texts]


# -- the classes, called as an actor calls them --------------------------------


@needs_ray
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"output": "top", "layers": [0, 1]},
        {"output": "average", "dtype": "float16"},
        {"tokenized": True, "layers": [2, 0]},
    ],
)
def test_embed_batches_give_the_embedders_vectors(spacy_bilm, options):
    tokenized = options.get("tokenized", False)
    sentences = spacy_tokens(TEXTS)
    column = sentences if tokenized else TEXTS
    batch = pyarrow.table({"id": list(range(len(TEXTS))), "text": column})
    out = EmbedBatches(spacy_bilm, tokens_column="tokens", **options)(batch)
    assert out.column_names == ["id", "text", "tokens", "vectors"]
    assert out["id"].to_pylist() == list(range(len(TEXTS)))  # passed through
    # The biLM records spaCy's tokenizer, so text is cut with it ("said", ".").
    assert out["tokens"].to_pylist() == sentences
    expected = Embedder(spacy_bilm, layers=options.get("layers")).embed(sentences)
    dtype = options.get("dtype", "float32")
    for array, layers in zip(tensors_to_numpy(out["vectors"]), expected):
        layers = {"all": layers, "top": layers[-1], "average": layers.mean(axis=0)}[
            options.get("output", "all")
        ]
        assert array.dtype == dtype and array.shape == layers.shape
        numpy.testing.assert_array_equal(array, layers.astype(dtype))
    assert tensors_to_numpy(out["vectors"])[1].shape[-2] == 0  # the empty text


@needs_ray
def test_embed_batches_refuse_what_they_cannot_use(spacy_bilm):
    embed = EmbedBatches(spacy_bilm)
    with pytest.raises(ValueError, match='batch_format="pyarrow"'):
        embed({"text": numpy.array(TEXTS)})
    with pytest.raises(ValueError, match="no column 'text' .* column=..."):
        embed(pyarrow.table({"sentence": TEXTS}))
    with pytest.raises(ValueError, match="already has a column 'vectors'"):
        embed(pyarrow.table({"text": TEXTS, "vectors": TEXTS}))
    with pytest.raises(ValueError, match="output = 'mean': use one of all, top, average"):
        EmbedBatches(spacy_bilm, output="mean")
    empty = embed(pyarrow.table({"text": pyarrow.array([], pyarrow.string())}))
    assert len(empty) == 0 and empty.schema.field("vectors").type.ndim == 3


def test_an_actor_takes_as_many_torch_threads_as_ray_gave_it_cpus(monkeypatch):
    class Context:
        def get_assigned_resources(self):
            return {"CPU": 2.0, "GPU": 1.0}

    class Actor:  # what ray says inside an actor with num_cpus=2, num_gpus=1
        get_runtime_context = Context
        get_gpu_ids = staticmethod(lambda: [3])

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert ray_data.set_actor_threads(None) == 1 == torch.get_num_threads()  # not in Ray
        assert ray_data.actor_device() == "cpu"
        monkeypatch.setattr(ray_data, "_ray_if_running", lambda: Actor)
        assert ray_data.set_actor_threads(None) == 2 == torch.get_num_threads()
        assert ray_data.set_actor_threads(3) == 3 == torch.get_num_threads()
        assert ray_data.actor_device() == "cuda"
    finally:
        torch.set_num_threads(threads)


# -- through Ray ---------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ray-corpus") / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


@needs_ray
@pytest.mark.slow  # a Ray cluster of its own, an actor killed and restarted (8 s)
def test_a_killed_actor_loses_no_line_and_writes_none_twice(
    ray_instance, spacy_bilm, corpus, tmp_path, monkeypatch
):
    """embed --engine ray, one actor of two killed (os._exit) on the batch of
    line 9, once: Ray restarts it and runs the batch again; the Parquet file
    holds every line once, in order, with embed's vectors to the bit."""
    marker = tmp_path / "died"

    class DiesOnce(EmbedBatches):  # defined here, so Ray ships it by value
        def __call__(self, batch):
            if 9 in batch["line"].to_pylist() and not marker.exists():
                marker.write_text(str(os.getpid()))
                os._exit(1)
            return super().__call__(batch)

    monkeypatch.setattr(ray_data, "EmbedBatches", DiesOnce)
    options = ["--top", "--layers", "0,1"]
    ray = ["--engine", "ray", "--actors", "2", "--lines-per-batch", "4"]
    done = cli("embed", spacy_bilm, corpus, tmp_path / "out.parquet", *options, *ray)
    assert done.returncode == 0, done.stderr
    assert f"{len(CORPUS)} lines" in done.stdout
    assert marker.exists()  # the fault did happen
    assert cli("embed", spacy_bilm, corpus, tmp_path / "out.hdf5", *options).returncode == 0
    table = pyarrow.parquet.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["line", "text", "tokens", "vectors"]
    assert table["line"].to_pylist() == list(range(len(CORPUS)))
    assert table["text"].to_pylist() == [line.strip() for line in CORPUS]
    assert table["tokens"].to_pylist() == [line.split() for line in CORPUS]
    with h5py.File(tmp_path / "out.hdf5") as embedded:
        for line, array in zip(table["line"].to_pylist(), tensors_to_numpy(table["vectors"])):
            assert array.dtype == numpy.float32
            numpy.testing.assert_array_equal(array, embedded[str(line)][...])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["died", "out.hdf5", "out.parquet"]


@pytest.fixture(scope="module")
def pipeline_dir(spacy_bilm, tmp_path_factory) -> Path:
    """elmo + textcat + tagger (listeners, a few updates) + entity_ruler, saved."""
    listener = {
        "@architectures": "elmo_spacy.ElmoListener.v1",
        "upstream": "elmo",
        "grad_factor": 0.0,
        "width": 8,
        "mix": {"@architectures": "elmo_spacy.ScalarMix.v1", "trainable": False},
    }
    textcat = {"@architectures": "spacy.TextCatReduce.v1", "exclusive_classes": True}
    textcat.update(use_reduce_mean=True, use_reduce_first=False, use_reduce_last=False)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo").initialize(lambda: [], bilm_path=spacy_bilm)
    nlp.add_pipe(
        "textcat", config={"model": {**textcat, "use_reduce_max": False, "tok2vec": listener}}
    )
    nlp.add_pipe(
        "tagger", config={"model": {"@architectures": "spacy.Tagger.v2", "tok2vec": listener}}
    )
    examples = []
    for words, tags, label in [
        (["Oil", "rose", "."], ["NN", "VBD", "."], "Business"),
        (["Teams", "won", "games", "."], ["NNS", "VBD", "NNS", "."], "Sports"),
    ]:
        doc = Doc(nlp.vocab, words=words, tags=tags)
        doc.cats = {"Business": float(label == "Business"), "Sports": float(label == "Sports")}
        examples.append(Example(Doc(nlp.vocab, words=words), doc))
    for name in ("textcat", "tagger"):
        nlp.get_pipe(name).initialize(lambda: examples, nlp=nlp)
    optimizer = nlp.create_optimizer()
    for _ in range(4):
        nlp.update(examples, sgd=optimizer)
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "ORG", "pattern": [{"TEXT": "Reuters"}]}])
    ruler.add_patterns([{"label": "GPE", "pattern": [{"LOWER": "china"}]}])
    path = tmp_path_factory.mktemp("ray") / "pipeline"
    nlp.to_disk(path)
    return path


@needs_ray
def test_annotate_batches_give_nlp_pipes_annotations(ray_instance, pipeline_dir):
    annotations = ["tokens", "cats", "ents", "tags", "tensor", "docbin"]
    dataset = ray_instance.data.from_items([{"id": i, "text": t} for i, t in enumerate(CORPUS)])
    annotated = dataset.repartition(3).map_batches(
        AnnotateBatches,
        fn_constructor_kwargs={"path": str(pipeline_dir), "annotations": annotations},
        batch_format="pyarrow",
        compute=ray_instance.data.ActorPoolStrategy(size=1),
    )
    rows = pyarrow.concat_tables(annotated.iter_batches(batch_format="pyarrow", batch_size=None))
    rows = rows.sort_by("id")
    assert rows.column_names == ["id", "text", *annotations]
    assert rows["id"].to_pylist() == list(range(len(CORPUS)))
    nlp = spacy.load(pipeline_dir)
    docs = list(nlp.pipe(CORPUS))
    assert rows["tokens"].to_pylist() == [[t.text for t in doc] for doc in docs]
    assert rows["cats"].to_pylist() == [doc.cats for doc in docs]
    assert len({json.dumps(doc.cats) for doc in docs}) > 1  # the scores are not all one
    assert rows["ents"].to_pylist() == [
        [{"start_char": e.start_char, "end_char": e.end_char, "label": e.label_} for e in doc.ents]
        for doc in docs
    ]
    assert {e["label"] for ents in rows["ents"].to_pylist() for e in ents} == {"ORG", "GPE"}
    assert rows["tags"].to_pylist() == [[t.tag_ for t in doc] for doc in docs]
    for doc, tensor, data in zip(
        docs, tensors_to_numpy(rows["tensor"]), rows["docbin"].to_pylist()
    ):
        numpy.testing.assert_array_equal(tensor, doc.tensor)
        (stored,) = DocBin().from_bytes(data).get_docs(nlp.vocab)
        assert stored.to_json() == doc.to_json()
        numpy.testing.assert_array_equal(stored._.elmo, doc._.elmo)


@needs_ray
def test_annotate_batches_refuse_an_annotation_no_pipe_sets(pipeline_dir):
    with pytest.raises(ValueError, match="'ents', but no pipe of .* sets doc.ents .*elmo, textcat"):
        AnnotateBatches(
            pipeline_dir, annotations=["cats", "ents"], disable=["entity_ruler", "tagger"]
        )
    with pytest.raises(ValueError, match="annotations = 'vectors': use one of tokens, cats"):
        AnnotateBatches(pipeline_dir, annotations=["vectors"])


# -- without Ray, and options that do not apply --------------------------------


def test_a_missing_ray_names_the_extra(spacy_bilm, corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails
    with pytest.raises(ValueError, match=r"pip install elmo_spacy\[ray\]"):
        ray_data.require_ray()
    done = cli("embed", spacy_bilm, corpus, tmp_path / "out.parquet", "--engine", "ray")
    assert done.returncode == 1
    assert "Ray Data is not installed" in done.stderr and "elmo_spacy[ray]" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "spark"], "--engine spark: use one of local, ray"),
        (["--actors", "2"], "--actors: for --engine ray only"),
        (["--ray-address", "auto", "--dtype", "float16"], "--ray-address, --dtype float16: for"),
        (["--output-format", "parquet"], "--output-format parquet is --engine ray's"),
        (["--engine", "ray", "--output-format", "hdf5"], "--engine ray writes Parquet, not hdf5"),
        (["--engine", "ray", "--gpu-id", "0"], "with --engine ray give --gpus-per-actor 1"),
        (["--engine", "ray", "--actors", "0"], "--actors 0: give a number above 0"),
        (["--engine", "ray", "--gpus-per-actor", "-1"], "--gpus-per-actor -1.0: give 0 or more"),
        (["--engine", "ray", "--dtype", "int8"], "--dtype int8: use float32 or float16"),
        (["--engine", "ray", "--use-sentence-keys"], "shape HDF5 output: the Parquet file"),
        (["--engine", "ray", "--layers", "0,5"], "--layers = [0, 5], but the biLM has 3 layers"),
    ],
)
def test_options_that_do_not_apply_are_refused_before_ray_starts(
    spacy_bilm, corpus, tmp_path, monkeypatch, args, message
):
    monkeypatch.setitem(sys.modules, "ray", None)  # none of these gets as far as Ray
    done = cli("embed", spacy_bilm, corpus, tmp_path / "out", *args)
    assert done.returncode == 1 and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_command_hands_its_options_to_the_ray_engine(spacy_bilm, corpus, tmp_path, monkeypatch):
    """What the thin CLI passes on (no Ray: `embed_to_parquet` is replaced)."""
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return 7, 42

    monkeypatch.setattr(ray_data, "embed_to_parquet", record)
    warmup = tmp_path / "warmup.txt"
    warmup.write_text("Markets were calm.\n", encoding="utf-8")
    done = cli(
        "embed", spacy_bilm, corpus, tmp_path / "out.parquet", "--engine", "ray", "--tokenize",
        "--average", "--layers", "1,2", "--state", "primed", "--warmup-file", warmup,
        "--dtype", "float16", "--actors", "3", "--cpus-per-actor", "2", "--part", "1/2",
        "--ray-address", "auto", "--max-batch-tokens", "512",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "7 lines, 42 tokens" in done.stdout
    ((bilm, lines, indices, output), options) = calls[0]
    assert (bilm, output) == (spacy_bilm, tmp_path / "out.parquet")
    assert lines == [line.strip() for line in CORPUS] and indices == list(range(1, 24, 2))
    assert options == {
        "embed_options": {
            "output": "average",
            "dtype": "float16",
            "run": RunSettings(
                layers=[1, 2],
                state="primed",
                warmup=[["Markets", "were", "calm", "."]],  # cut as the lines are
                max_batch_tokens=512,
            ),
            "tokenization": Tokenization("spacy", "en"),
        },
        "actors": 3,
        "cpus_per_actor": 2,
        "gpus_per_actor": 0,
        "lines_per_batch": 256,
        "address": "auto",
    }
