"""`elmo_spacy.bilm.formats.onnx_inputs`: an export's inputs made from tokens
with numpy alone (inputs.json and vocab.txt, not the model), equal to what
the package makes from the biLM, and fed to onnxruntime, the layers
`Embedder` gives; it loads where torch cannot be imported, and the client
of docs/embedding.md runs as written."""

import json
import re
import shutil
import subprocess
import sys

import numpy
import pytest

from elmo_spacy.bilm import load_bilm
from elmo_spacy.bilm.formats import onnx_inputs
from elmo_spacy.bilm.formats.exported import export_bilm, serving_inputs
from elmo_spacy.bilm.formats.onnx_inputs import ExportInputs
from elmo_spacy.embedder import Embedder
from elmo_spacy.errors import ElmoSpacyError

from .conftest import ROOT, cli
from .test_export import (
    BILM_TF,
    EFML,
    assert_close,
    needs_bilm_tf,
    needs_efml,
    onnx_layers,
    per_sentence,
    tiny,
)

pytest.importorskip("onnxruntime", reason="onnxruntime runs the exported models")

# Repeats, marks and boundary tokens of each scheme, bytes and characters
# past ASCII, a token longer than max_chars, a lone surrogate, an empty sentence.
SENTENCES = [
    ["She", "sat", "on", "the", "bank", "of", "the", "river", "."],
    ["the", "river", "<S>", "</S>", "<bos>", "<eos>", "naïve", "café", "€"],
    [],
    ["Antidisestablishmentarianism" * 2, "a\udc80b", "x", "She"],
]
# Python with `import torch` (and the package, which imports it) failing.
WITHOUT_TORCH = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, NoTorch())
"""


def assert_same_inputs(mine: dict, theirs: dict) -> None:
    assert list(mine) == list(theirs)
    for name in theirs:
        assert mine[name].dtype == theirs[name].dtype, name
        numpy.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)


@pytest.mark.parametrize(
    "encoder",
    [  # word_char reads both kinds of ids; the docs client's test runs a char CNN's export
        pytest.param("char_cnn", marks=pytest.mark.slow),
        pytest.param("word", marks=pytest.mark.slow),
        "word_char",
    ],
)
def test_the_inputs_from_the_folder_are_the_packages_and_give_embedders_layers(tmp_path, encoder):
    bilm = tiny(encoder, clipped=True)
    export_bilm(bilm, tmp_path, formats=["onnx"])
    make_inputs = ExportInputs(tmp_path)
    for sentences in (SENTENCES, [["Another", "batch", "."]]):
        inputs = make_inputs(sentences)
        assert_same_inputs(inputs, serving_inputs(bilm, sentences))
        (layers,) = onnx_layers(tmp_path / "bilm.onnx", inputs)
        assert_close(per_sentence(layers, sentences), Embedder(bilm).embed(sentences))


@pytest.mark.slow  # an export of its own (8 s)
def test_an_export_with_states_gets_zero_states_to_start_from(tmp_path):
    bilm = tiny("char_cnn", clipped=False)
    export_bilm(bilm, tmp_path, formats=["onnx"], with_states=True)
    inputs = ExportInputs(tmp_path)(SENTENCES)
    assert_same_inputs(inputs, serving_inputs(bilm, SENTENCES, with_states=True))
    layers, final_h, _ = onnx_layers(tmp_path / "bilm.onnx", inputs)
    assert_close(per_sentence(layers, SENTENCES), Embedder(bilm).embed(SENTENCES))
    assert final_h.shape == inputs["initial_h"].shape


@needs_bilm_tf
def test_bilm_tfs_scheme_its_boundary_tokens_and_padding(tmp_path):
    """The ids alone (the published model's ONNX run: test_export.py)."""
    bilm = load_bilm(BILM_TF)
    export_bilm(bilm, tmp_path, formats=["torch-export"])
    assert json.loads((tmp_path / "inputs.json").read_text())["inputs"]["char_ids"]["scheme"] == (
        "bilm_tf"
    )
    assert_same_inputs(ExportInputs(tmp_path)(SENTENCES), serving_inputs(bilm, SENTENCES))


@needs_efml
def test_elmoformanylangs_character_vocabulary_and_cut_words(tmp_path):
    """Characters looked up in inputs.json's char_vocab, words cut as the
    reference cuts them; the ids alone (its ONNX run: test_export.py)."""
    bilm = load_bilm(EFML / "model")
    export_bilm(bilm, tmp_path, formats=["torch-export"])
    described = json.loads((tmp_path / "inputs.json").read_text())
    assert described["inputs"]["char_ids"]["scheme"] == "char_vocab"
    given = json.loads((EFML / "sentences.json").read_text())
    sentences = [*SENTENCES, *(s.split(" ") for s in given)]
    assert_same_inputs(ExportInputs(tmp_path)(sentences), serving_inputs(bilm, sentences))


def test_a_folder_it_cannot_read_is_refused_saying_why(tmp_path):
    with pytest.raises(ElmoSpacyError, match=r"inputs.json is missing: give the folder that"):
        ExportInputs(tmp_path)
    (tmp_path / "inputs.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ElmoSpacyError, match="'something else', not 'elmo_spacy serving biLM"):
        ExportInputs(tmp_path)


@pytest.mark.slow  # the docs client's test runs the copied file without torch too
def test_the_module_loads_and_runs_where_torch_cannot_be_imported(tmp_path):
    """A copy of the file alone, numpy its only dependency: torch blocked."""
    bilm = tiny("word_char", clipped=False)
    (tmp_path / "served").mkdir()
    export_bilm(bilm, tmp_path / "served", formats=["onnx"])
    shutil.copy(onnx_inputs.__file__, tmp_path / "onnx_inputs.py")
    script = WITHOUT_TORCH + (
        "import json, sys\n"
        "from onnx_inputs import ExportInputs\n"
        "inputs = ExportInputs('served')(json.loads(sys.argv[1]))\n"
        "print(json.dumps({k: v.tolist() for k, v in inputs.items()}))\n"
        "assert 'torch' not in sys.modules and 'elmo_spacy' not in sys.modules\n"
        "try:\n    import torch\nexcept ImportError:\n    pass\n"
        "else:\n    raise SystemExit('torch was not blocked')\n"
    )
    sentences = [["She", "sat", "."], ["naïve", "She"]]
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(sentences)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    made = {k: numpy.array(v, dtype="int64") for k, v in json.loads(done.stdout).items()}
    assert_same_inputs(made, serving_inputs(bilm, sentences))


def docs_client() -> str:
    """The Python block of docs/embedding.md's onnxruntime client."""
    text = (ROOT / "docs" / "embedding.md").read_text(encoding="utf-8")
    section = text.split("### A client with onnxruntime and numpy alone")[1].split("\n#")[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def test_the_docs_client_runs_without_torch_and_gives_embedders_layers(bilm_dir, tmp_path):
    """As the docs say: `elmo-spacy export` into served/, onnx_inputs.py
    copied beside the client, which runs with torch blocked."""
    result = cli("export", bilm_dir, tmp_path / "served", "--format", "onnx")
    assert result.returncode == 0, result.stderr
    shutil.copy(onnx_inputs.__file__, tmp_path / "onnx_inputs.py")
    script = WITHOUT_TORCH + (
        "namespace = {}\n"
        "exec(open('client.py').read(), namespace)\n"
        "import json, numpy\n"
        "numpy.savez('vectors.npz', *namespace['vectors'])\n"
        "json.dump(namespace['sentences'], open('sentences.json', 'w'))\n"
    )
    (tmp_path / "client.py").write_text(docs_client(), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    sentences = json.loads((tmp_path / "sentences.json").read_text())
    with numpy.load(tmp_path / "vectors.npz") as saved:
        vectors = [saved[f"arr_{i}"] for i in range(len(sentences))]
    assert_close(vectors, Embedder(bilm_dir).embed(sentences))
