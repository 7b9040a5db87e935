"""The `textcat_every_doc` pipe: spaCy's single-label textcat, scores summing
to 1 on every doc, empty docs too. Nothing in it is about ELMo; its old name,
`elmo_textcat`, stays registered so that configs and pipelines saved with it
still load."""

import warnings
from collections.abc import Callable, Iterable

from spacy.language import Language
from spacy.pipeline.textcat import TextCategorizer
from spacy.tokens import Doc
from thinc.api import Config, Model
from thinc.types import Floats2d

DEFAULT_TEXTCAT_MODEL = """
[model]
@architectures = "elmo_spacy.TextCatBiLSTM.v1"

[model.tok2vec]
@architectures = "elmo_spacy.ElmoListener.v1"
upstream = "elmo"
grad_factor = 0.0

[model.tok2vec.mix]
@architectures = "elmo_spacy.ScalarMix.v1"
trainable = true
"""


FACTORY_SETTINGS = {
    "assigns": ["doc.cats"],
    "default_config": {
        "threshold": 0.0,
        "model": Config().from_str(DEFAULT_TEXTCAT_MODEL)["model"],
        "scorer": {"@scorers": "spacy.textcat_scorer.v2"},
    },
    "default_score_weights": {
        "cats_score": 1.0,
        "cats_macro_f": None,
        "cats_macro_auc": None,
        "cats_f_per_type": None,
    },
}


@Language.factory("textcat_every_doc", **FACTORY_SETTINGS)
def make_textcat_every_doc(
    nlp: Language, name: str, model: Model, threshold: float, scorer: Callable | None
) -> "EveryDocTextCategorizer":
    return EveryDocTextCategorizer(nlp.vocab, model, name, threshold=threshold, scorer=scorer)


@Language.factory("elmo_textcat", **FACTORY_SETTINGS)
def make_elmo_textcat(
    nlp: Language, name: str, model: Model, threshold: float, scorer: Callable | None
) -> "EveryDocTextCategorizer":
    """Deprecated: the old name of `textcat_every_doc`, for saved configs."""
    warnings.warn(
        f'[components.{name}] factory = "elmo_textcat" is the old name of '
        '"textcat_every_doc" (the same pipe): write the new name in the config',
        DeprecationWarning,
        stacklevel=2,
    )
    return make_textcat_every_doc(nlp, name, model, threshold, scorer)


class EveryDocTextCategorizer(TextCategorizer):
    """spaCy's `textcat` (exclusive classes), except that a batch of docs
    without tokens goes through the model like any other. spaCy's own returns
    all-zero scores for such a batch, so `nlp("").cats` would not sum to 1.
    The model must accept empty docs, as `elmo_spacy.TextCatBiLSTM.v1` does.
    """

    def predict(self, docs: Iterable[Doc]) -> Floats2d:
        return self.model.predict(list(docs))


ElmoTextCategorizer = EveryDocTextCategorizer  # deprecated: the class's old name
