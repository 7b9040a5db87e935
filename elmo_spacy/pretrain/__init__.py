"""biLM pretraining: text prepared once into a corpus on disk (`prepare_corpus`),
streamed in length-bucketed batches to the training loop (`pretrain`)."""

from ..bilm.inputs.tokenization import Tokenization
from .config import PretrainConfig, load_pretrain_config
from .corpus import Corpus
from .distributed import ProcessGroup, join_process_group, leave_process_group
from .loop import evaluate_perplexity
from .prepare import open_corpus, prepare_corpus, prepare_docs
from .train import pretrain

__all__ = [
    "Corpus",
    "PretrainConfig",
    "ProcessGroup",
    "Tokenization",
    "evaluate_perplexity",
    "join_process_group",
    "leave_process_group",
    "load_pretrain_config",
    "open_corpus",
    "prepare_corpus",
    "prepare_docs",
    "pretrain",
]
