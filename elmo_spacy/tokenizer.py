"""`elmo_spacy.Tokenizer.v1`: spaCy's rule-based tokenizer, safe for lone surrogates."""

import re
from collections.abc import Callable

from spacy import util
from spacy.language import Language
from spacy.language import create_tokenizer as create_default_tokenizer
from spacy.tokenizer import Tokenizer
from spacy.tokens import Doc

from .errors import ElmoSpacyError

LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class SurrogateSafeTokenizer(Tokenizer):
    """spaCy's tokenizer, except that each lone surrogate (U+D800-U+DFFF, e.g.
    from bytes decoded with `surrogateescape`) becomes U+FFFD first. spaCy's own
    raises UnicodeEncodeError on them. Character offsets do not move."""

    def __call__(self, text: str) -> Doc:
        return super().__call__(LONE_SURROGATE.sub("\ufffd", text))


@util.registry.tokenizers("elmo_spacy.Tokenizer.v1")
def create_tokenizer() -> Callable[[Language], Tokenizer]:
    """The language's default tokenizer (`spacy.Tokenizer.v1`), surrogate-safe."""
    make_default = create_default_tokenizer()

    def make_tokenizer(nlp: Language) -> Tokenizer:
        default = make_default(nlp)
        return SurrogateSafeTokenizer(
            nlp.vocab,
            rules=default.rules,
            prefix_search=default.prefix_search,
            suffix_search=default.suffix_search,
            infix_finditer=default.infix_finditer,
            token_match=default.token_match,
            url_match=default.url_match,
        )

    return make_tokenizer


def blank(lang: str, named_by: str) -> Language:
    """`spacy.blank(lang)`; a language spaCy does not have is refused, naming
    where it came from (`named_by`: "--lang xy", a biLM's tokenization)."""
    import spacy

    try:
        return spacy.blank(lang)
    except ImportError as err:
        raise ElmoSpacyError(
            f"{named_by}: spaCy has no such language; give one of its codes (en, de, zh, "
            "..., xx for any language: https://spacy.io/usage/models#languages)"
        ) from err
