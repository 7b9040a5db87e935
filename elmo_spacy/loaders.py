"""Registered biLM loaders, for a config that names the format of its biLM
(docs/models.md): each reads the files when the pipe is initialised."""

from collections.abc import Callable
from functools import partial
from pathlib import Path

from spacy.util import registry

from .bilm import BiLM
from .bilm.formats.bilm_tf import read_bilm_tf
from .bilm.formats.directory import read_bilm_directory
from .bilm.formats.efml import read_efml
from .bilm.formats.locate import read_bilm_tf_in

BiLMLoader = Callable[[], BiLM]


@registry.misc("elmo_spacy.BiLMFolder.v1")
def bilm_folder_loader(path: Path) -> BiLMLoader:
    """A biLM directory (pretraining's model-best/, or a converted model)."""
    return partial(read_bilm_directory, path, with_softmax=False)


@registry.misc("elmo_spacy.BilmTf.v1")
def bilm_tf_loader(options_file: Path, weight_file: Path) -> BiLMLoader:
    """A bilm-tf model's two files, as AllenNLP's `Elmo(options_file, weight_file)`."""
    return partial(read_bilm_tf, options_file, weight_file)


@registry.misc("elmo_spacy.BilmTfFolder.v1")
def bilm_tf_folder_loader(path: Path) -> BiLMLoader:
    """The one bilm-tf model in a folder or an NLPL .zip archive."""
    return partial(read_bilm_tf_in, path)


@registry.misc("elmo_spacy.ELMoForManyLangs.v1")
def efml_loader(path: Path) -> BiLMLoader:
    """An ELMoForManyLangs model folder, as unpacked from its archive."""
    return partial(read_efml, path)
