"""`elmo_spacy.ReleaseTrainingCaches.v1`: a logger, the one hook spaCy's
training loop calls at its end."""

import sys
from collections.abc import Callable
from typing import IO, Any

from spacy.language import Language
from spacy.util import registry


@registry.loggers("elmo_spacy.ReleaseTrainingCaches.v1")
def release_training_caches(logger: Callable | None = None) -> Callable:
    """Wrap a training logger (spaCy's console logger by default); when
    training finishes, empty the frozen-output cache of every `elmo` pipe."""
    from .pipeline import Elmo

    inner = logger or registry.get("loggers", "spacy.ConsoleLogger.v1")()

    def setup(
        nlp: Language, stdout: IO = sys.stdout, stderr: IO = sys.stderr
    ) -> tuple[Callable[[dict[str, Any] | None], None], Callable[[], None]]:
        log_step, finalize = inner(nlp, stdout, stderr)

        def finalize_and_release() -> None:
            finalize()
            for _, pipe in nlp.pipeline:
                if isinstance(pipe, Elmo):
                    pipe.frozen_cache.clear()

        return log_step, finalize_and_release

    return setup
