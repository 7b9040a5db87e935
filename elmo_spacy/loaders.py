"""Registered biLM loaders: a config names the format of the biLM that the
`elmo` pipe starts from (docs/models.md, "Naming the format in a config").
Each returns a `BiLMLoader`, which reads the files when the pipe is
initialised, and gives the biLM without a softmax head.
"""

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
    """A biLM directory: what `elmo-spacy pretrain` writes into model-best/,
    and `convert-elmo` and `convert-efml` write."""
    return partial(read_bilm_directory, path, with_softmax=False)


@registry.misc("elmo_spacy.BilmTf.v1")
def bilm_tf_loader(options_file: Path, weight_file: Path) -> BiLMLoader:
    """A bilm-tf model's two files (the published ELMo models), of any names
    in any folders, as AllenNLP's `Elmo(options_file, weight_file)` takes them."""
    return partial(read_bilm_tf, options_file, weight_file)


@registry.misc("elmo_spacy.BilmTfFolder.v1")
def bilm_tf_folder_loader(path: Path) -> BiLMLoader:
    """The one bilm-tf model in a folder (published, AllenNLP's or NLPL's
    files) or in an NLPL .zip archive as downloaded."""
    return partial(read_bilm_tf_in, path)


@registry.misc("elmo_spacy.ELMoForManyLangs.v1")
def efml_loader(path: Path) -> BiLMLoader:
    """An ELMoForManyLangs model folder, as unpacked from its archive."""
    return partial(read_efml, path)
