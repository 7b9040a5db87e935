"""The word vocabulary: softmax targets, and the rows of the word encoder."""

from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from ...errors import ElmoSpacyError

PAD, UNK, BOS, EOS = "<PAD>", "<UNK>", "<S>", "</S>"
SPECIALS = (PAD, UNK, BOS, EOS)
# ELMoForManyLangs' names for the same four, kept in its converted models
EFML_SPECIALS = ("<pad>", "<oov>", "<bos>", "<eos>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)


class WordVocab:
    """Word types by falling frequency (the adaptive softmax's head holds the
    first ids) after the four specials: SPECIALS, or EFML_SPECIALS."""

    def __init__(self, words: Sequence[str]) -> None:
        words = list(words)
        if tuple(words[: len(SPECIALS)]) not in (SPECIALS, EFML_SPECIALS):
            raise ElmoSpacyError(
                f"A vocabulary must start with the specials {SPECIALS} (or, converted from "
                f"ELMoForManyLangs, {EFML_SPECIALS}), got {words[: len(SPECIALS)]}"
            )
        self.words: list[str] = words
        self.index: dict[str, int] = {w: i for i, w in enumerate(words)}
        if len(self.index) != len(words):
            raise ElmoSpacyError("A vocabulary must not repeat a word")

    def __len__(self) -> int:
        return len(self.words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WordVocab) and self.words == other.words

    @classmethod
    def build(
        cls, sentences: Iterable[Sequence[str]], *, max_size: int, min_count: int
    ) -> "WordVocab":
        """The `max_size` most frequent word types seen at least `min_count`
        times (ties broken alphabetically)."""
        counts: Counter = Counter()
        for tokens in sentences:
            counts.update(tokens)
        kept = [w for w, c in counts.items() if c >= min_count and w not in SPECIALS]
        kept.sort(key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + kept[: max(0, max_size - len(SPECIALS))])

    @classmethod
    def specials_only(cls) -> "WordVocab":
        """The four specials (a biLM without softmax that reads characters)."""
        return cls(list(SPECIALS))

    def word_ids(self, types: Sequence[str]) -> torch.Tensor:
        """Ids of <S>, </S> and then each of `types` (UNK_ID if unknown): (2 + U,) int64."""
        ids = [BOS_ID, EOS_ID] + [self.index.get(t, UNK_ID) for t in types]
        return torch.tensor(ids, dtype=torch.int64)
