"""The registered biLM loaders (`elmo_spacy.loaders`): a config names a
format's reader, which reads what `load_bilm` reads from the same files,
only when the pipe is initialised, and says what is wrong as `load_bilm` does."""

import subprocess
import sys
import zipfile

import numpy
import pytest
import spacy
import torch
from spacy.util import registry

from elmo_spacy.bilm import BiLM, load_bilm, save_bilm
from elmo_spacy.bilm.formats.bilm_tf import write_bilm_tf
from elmo_spacy.bilm.formats.checks import BiLMLoadError

from .conftest import tokenize
from .test_efml import write_efml
from .test_elmo_format import tiny_elmo

SENTENCES = tokenize(["The bank raised rates on Monday .", "She sat by the river bank ."])


def outputs(bilm: BiLM) -> torch.Tensor:
    with torch.inference_mode():
        return bilm(bilm.batch(SENTENCES))


def resolve(name: str, **args) -> BiLM:
    """The biLM of the loader that a config block `{"@misc": name, **args}` names."""
    block = {"@misc": name, **{key: str(value) for key, value in args.items()}}
    return registry.resolve({"loader": block})["loader"]()


def test_each_loader_reads_what_load_bilm_reads_from_the_same_files(tmp_path):
    options, weights = write_bilm_tf(tiny_elmo(), tmp_path / "tf")
    folder = save_bilm(load_bilm(tmp_path / "tf"), tmp_path / "bilm")
    with zipfile.ZipFile(tmp_path / "nlpl.zip", "w") as archive:
        archive.write(options, "209/options.json")
        archive.write(weights, "209/model.hdf5")
    efml = write_efml(tmp_path / "efml")
    cases = [
        ("elmo_spacy.BiLMFolder.v1", {"path": folder}, folder),
        ("elmo_spacy.BilmTf.v1", {"options_file": options, "weight_file": weights}, folder),
        ("elmo_spacy.BilmTfFolder.v1", {"path": tmp_path / "tf"}, folder),
        ("elmo_spacy.BilmTfFolder.v1", {"path": tmp_path / "nlpl.zip"}, folder),
        ("elmo_spacy.ELMoForManyLangs.v1", {"path": efml}, efml),
    ]
    for name, args, path in cases:
        bilm = resolve(name, **args)
        assert bilm.softmax is None, name
        assert torch.equal(outputs(bilm), outputs(load_bilm(path))), (name, args)


def test_a_loader_reads_nothing_until_it_is_called(tmp_path):
    loader = registry.resolve(
        {"loader": {"@misc": "elmo_spacy.BilmTf.v1", "options_file": "a", "weight_file": "b"}}
    )["loader"]
    with pytest.raises(BiLMLoadError, match="The options file of the bilm-tf pair"):
        loader()


def message(name: str, **args) -> str:
    with pytest.raises(BiLMLoadError) as error:
        resolve(name, **args)
    return " ".join(str(error.value).split())


def test_a_loader_says_what_is_wrong(tmp_path):
    options, weights = write_bilm_tf(tiny_elmo(), tmp_path / "tf")
    text = message(
        "elmo_spacy.BilmTf.v1", options_file=options, weight_file=tmp_path / "tf" / "weight.hdf5"
    )
    assert "The weights file of the bilm-tf pair" in text and f"Did you mean {weights}?" in text
    assert "the wrong way round" in message(
        "elmo_spacy.BilmTf.v1", options_file=weights, weight_file=options
    )
    text = message("elmo_spacy.BiLMFolder.v1", path=tmp_path / "tf")
    assert f"{tmp_path / 'tf'} is not a biLM directory" in text
    save_bilm(load_bilm(tmp_path / "tf"), tmp_path / "run" / "model-best")
    text = message("elmo_spacy.BiLMFolder.v1", path=tmp_path / "run")
    assert f"point to its model-best, {tmp_path / 'run' / 'model-best'}" in text
    (tmp_path / "run" / "model-best" / "vocab.json").unlink()
    text = message("elmo_spacy.BiLMFolder.v1", path=tmp_path / "run" / "model-best")
    assert "incomplete biLM directory: vocab.json is missing" in text
    text = message("elmo_spacy.BilmTfFolder.v1", path=tmp_path / "run")
    assert "holds no bilm-tf model: looked for options.json + weights.hdf5" in text
    text = message("elmo_spacy.ELMoForManyLangs.v1", path=tmp_path / "efml")
    assert f"{tmp_path / 'efml'} does not exist" in text


def test_the_pipe_initialises_from_the_loader_its_config_names(tmp_path):
    """What the pipe reads through a named loader is what it reads from the
    path; setting both is refused. (test_pipeline reloads such a pipeline.)"""
    options, weights = write_bilm_tf(tiny_elmo(), tmp_path / "tf")
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    nlp.config["initialize"]["components"]["elmo"] = {
        "bilm_loader": {
            "@misc": "elmo_spacy.BilmTf.v1",
            "options_file": str(options),
            "weight_file": str(weights),
        }
    }
    nlp.initialize()
    by_path = spacy.blank("en")
    by_path.add_pipe("elmo").initialize(lambda: [], bilm_path=tmp_path / "tf")
    text = " ".join(SENTENCES[0])
    assert numpy.array_equal(nlp(text)._.elmo, by_path(text)._.elmo)
    nlp.config["initialize"]["components"]["elmo"]["bilm_path"] = str(tmp_path / "tf")
    with pytest.raises(ValueError, match="both bilm_path and bilm_loader"):
        nlp.initialize()


FILL = """
[nlp]
lang = "en"
pipeline = ["elmo"]

[components]

[components.elmo]
factory = "elmo"

[initialize]

[initialize.components]

[initialize.components.elmo]

[initialize.components.elmo.bilm_loader]
@misc = "elmo_spacy.BilmTf.v1"
options_file = "downloads/elmo_options.json"
weight_file = "downloads/elmo_weights.hdf5"
"""


def test_spacy_fill_config_keeps_a_loader(tmp_path):
    from spacy.cli.init_config import fill_config

    (tmp_path / "base.cfg").write_text(FILL)
    fill_config(tmp_path / "filled.cfg", tmp_path / "base.cfg", silent=True)
    filled = spacy.util.load_config(tmp_path / "filled.cfg")
    assert filled["initialize"]["components"]["elmo"]["bilm_loader"] == {
        "@misc": "elmo_spacy.BilmTf.v1",
        "options_file": "downloads/elmo_options.json",
        "weight_file": "downloads/elmo_weights.hdf5",
    }


@pytest.mark.slow  # a process of its own: about 5 s
def test_the_loaders_are_found_by_their_entry_points(tmp_path):
    """In a folder of its own: the repository's root may hold a stale
    elmo_spacy.egg-info from a build, whose entry points Python would read."""
    code = (
        "import sys, spacy\n"
        "assert 'elmo_spacy' not in sys.modules\n"
        "for name in ('BiLMFolder', 'BilmTf', 'BilmTfFolder', 'ELMoForManyLangs'):\n"
        "    spacy.registry.misc.get(f'elmo_spacy.{name}.v1')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
