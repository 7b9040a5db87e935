"""`elmo_spacy.Tokenizer.v1`: spaCy's rule-based tokenizer, safe for lone surrogates."""

import re
from collections.abc import Callable

from spacy import util
from spacy.language import Language
from spacy.tokenizer import Tokenizer
from spacy.tokens import Doc

LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class SurrogateSafeTokenizer(Tokenizer):
    """spaCy's tokenizer, except that each lone surrogate (U+D800-U+DFFF, e.g.
    from bytes decoded with `surrogateescape`) becomes U+FFFD first. spaCy's own
    raises UnicodeEncodeError on them. Character offsets do not move."""

    def __call__(self, text: str) -> Doc:
        return super().__call__(LONE_SURROGATE.sub("\ufffd", text))


@util.registry.tokenizers("elmo_spacy.Tokenizer.v1")
def create_tokenizer() -> Callable[[Language], Tokenizer]:
    """The language's default tokenizer settings, as `spacy.Tokenizer.v1`."""

    def make_tokenizer(nlp: Language) -> Tokenizer:
        defaults = nlp.Defaults
        return SurrogateSafeTokenizer(
            nlp.vocab,
            rules=defaults.tokenizer_exceptions,
            prefix_search=util.compile_prefix_regex(defaults.prefixes).search
            if defaults.prefixes
            else None,
            suffix_search=util.compile_suffix_regex(defaults.suffixes).search
            if defaults.suffixes
            else None,
            infix_finditer=util.compile_infix_regex(defaults.infixes).finditer
            if defaults.infixes
            else None,
            token_match=defaults.token_match,
            url_match=defaults.url_match,
        )

    return make_tokenizer
