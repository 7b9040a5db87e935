"""How a text was cut into the tokens a biLM reads, recorded with a prepared
corpus and the biLM pretrained on it, so that embedding cuts text alike."""

from dataclasses import dataclass
from typing import Any

from ...errors import ElmoSpacyError

TOKENIZERS = ("spacy", "whitespace")


@dataclass(frozen=True)
class Tokenization:
    """ "spacy": spaCy's tokenizer for `lang`; "whitespace": split on white
    space (pre-tokenised text, the published models)."""

    tokenizer: str
    lang: str | None = None

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise ElmoSpacyError(f"tokenizer = {self.tokenizer!r}: one of {', '.join(TOKENIZERS)}")
        if self.tokenizer == "spacy" and not self.lang:
            raise ElmoSpacyError("spaCy's tokenizer needs a language (lang)")

    def to_dict(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer, "lang": self.lang}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Tokenization":
        try:
            return cls(values["tokenizer"], values.get("lang"))
        except (KeyError, TypeError) as err:
            raise ElmoSpacyError(f"not a tokenization: {values!r}") from err

    def __str__(self) -> str:
        if self.tokenizer == "spacy":
            return f"spaCy's tokenizer for {self.lang!r}"
        return "white space"


WHITESPACE = Tokenization("whitespace")
