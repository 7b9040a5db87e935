"""biLM pretraining: tokenised text -> length-bucketed batches -> training loop."""

from .batching import bucketed_batches, split_long
from .config import PretrainConfig, load_pretrain_config
from .distributed import Workers, start_workers, stop_workers
from .train import evaluate_perplexity, pretrain

__all__ = [
    "PretrainConfig",
    "Workers",
    "bucketed_batches",
    "evaluate_perplexity",
    "load_pretrain_config",
    "pretrain",
    "split_long",
    "start_workers",
    "stop_workers",
]
