"""biLM pretraining: text prepared once into a corpus on disk (`prepare_corpus`),
streamed in length-bucketed batches to the training loop (`pretrain`)."""

from ..bilm.inputs.tokenization import Tokenization
from .config import PretrainConfig, load_pretrain_config
from .corpus import Corpus
from .distributed import Workers, start_workers, stop_workers
from .prepare import open_corpus, prepare_corpus, prepare_docs
from .train import evaluate_perplexity, pretrain

__all__ = [
    "Corpus",
    "PretrainConfig",
    "Tokenization",
    "Workers",
    "evaluate_perplexity",
    "load_pretrain_config",
    "open_corpus",
    "prepare_corpus",
    "prepare_docs",
    "pretrain",
    "start_workers",
    "stop_workers",
]
