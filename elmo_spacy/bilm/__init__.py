"""The ELMo bidirectional language model, in plain PyTorch.

Four subpackages, each with one job: `model/` (the network: modules, layers,
the language-model loss), `inputs/` (token strings to ids and batches),
`runtime/` (kernels, precision, caches, carried state: running it fast) and
`formats/` (reading and writing biLMs, exporting them for serving). `BiLM`
(bilm.py) puts them together; `runner.py` runs a biLM over sentences with
its settings, for every caller. Imports go one way:
runtime and formats use the model and the inputs, never the other way.
Nothing here imports spaCy or thinc: the biLM can be built, trained,
profiled and saved on its own.
"""

from .bilm import BiLM
from .formats.directory import save_bilm
from .formats.locate import load_bilm
from .inputs.batch import TokenBatch
from .inputs.vocab import WordVocab
from .model.config import BiLMConfig
from .model.network import LMLoss

__all__ = ["BiLM", "BiLMConfig", "LMLoss", "TokenBatch", "WordVocab", "load_bilm", "save_bilm"]
