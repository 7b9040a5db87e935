"""CoNLL-2003 (named entities) and CoNLL-U (UD part-of-speech tags) -> spaCy Docs.

CoNLL-2003: a token a line (`token POS chunk NER`), a blank line between
sentences, `-DOCSTART-` lines between documents (in the shared copy at each
document's end, in the original at its start: either works); entity tags in
IOB1. Each document becomes one Doc with its sentence boundaries and entities.

CoNLL-U: spaCy's converter, which keeps the words (not the multi-word token
ranges), UPOS as `token.pos_` and XPOS as `token.tag_`; ten sentences a Doc.
"""

import hashlib
from collections.abc import Iterator
from pathlib import Path

from spacy.tokens import Doc
from spacy.training import biluo_tags_to_spans, iob_to_biluo
from spacy.vocab import Vocab

# md5 of the files this project knows, and what each one is.
KNOWN_MD5 = {
    "eng.train": {"e9ad8146e5971d7a66834e05ea4f0248": "CoNLL-2003 English train"},
    "eng.testa": {"eba0f72fe26f1a5f661908684b8abcb6": "CoNLL-2003 English development"},
    "en_ewt-ud-train.conllu": {"fa9865539033efcf99ea90f8b93d6646": "UD English EWT 2.16 train"},
    "en_ewt-ud-dev.conllu": {"cb1da95ff28a449cb9bc286c922e15e1": "UD English EWT 2.16 dev"},
}
DOCSTART = "-DOCSTART-"


class ConllFormatError(ValueError):
    """A line that cannot be read; the message names file and line."""


def check_md5(path: Path) -> str | None:
    """What the file at `path` is, by its md5; None for a file name this project
    does not know (e.g. a test split). Raises ValueError, naming the file and
    both checksums, for a known name with other content."""
    known = KNOWN_MD5.get(path.name)
    if known is None:
        return None
    digest = hashlib.md5(path.read_bytes()).hexdigest()
    if digest not in known:
        expected = " or ".join(f"{md5} ({what})" for md5, what in known.items())
        raise ValueError(
            f"{path}: md5 is {digest}, expected {expected}. The file may be truncated or "
            "altered: copy it again, or pass --no-verify to use it as it is."
        )
    return known[digest]


def read_conll2003(path: Path, vocab: Vocab) -> Iterator[Doc]:
    """One Doc a document, with sentence starts and entities."""
    sentences: list[list[tuple[str, str]]] = []
    sentence: list[tuple[str, str]] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            fields = line.split()
            if not fields:
                if sentence:
                    sentences.append(sentence)
                    sentence = []
                continue
            if fields[0] == DOCSTART:
                if sentence:
                    sentences.append(sentence)
                    sentence = []
                if sentences:
                    yield _document(vocab, sentences)
                    sentences = []
                continue
            tag = fields[-1]
            if len(fields) < 2 or not (tag == "O" or tag[:2] in ("I-", "B-")):
                raise ConllFormatError(
                    f"{path}:{number}: expected 'token ... NER-tag' with an IOB tag last, "
                    f"got {line.strip()!r}"
                )
            sentence.append((fields[0], tag))
    if sentence:
        sentences.append(sentence)
    if sentences:
        yield _document(vocab, sentences)


def _document(vocab: Vocab, sentences: list[list[tuple[str, str]]]) -> Doc:
    words = [word for sentence in sentences for word, _ in sentence]
    starts = [i == 0 for sentence in sentences for i in range(len(sentence))]
    doc = Doc(vocab, words=words, sent_starts=starts)
    tags: list[str] = []
    for sentence in sentences:  # an entity never crosses a sentence boundary
        tags += iob_to_biluo([tag for _, tag in sentence])
    doc.ents = biluo_tags_to_spans(doc, tags)
    return doc


def read_conllu(path: Path, vocab: Vocab, n_sents: int = 10) -> Iterator[Doc]:
    """Docs of `n_sents` sentences with their words, UPOS (pos_) and XPOS
    (tag_), read by spaCy's converter; nothing else of the treebank is kept."""
    from spacy.training.converters import conllu_to_docs

    text = path.read_text(encoding="utf-8")
    for read in conllu_to_docs(text, n_sents=n_sents, merge_subtokens=False, no_print=True):
        yield Doc(
            vocab,
            words=[t.text for t in read],
            spaces=[bool(t.whitespace_) for t in read],
            pos=[t.pos_ for t in read],
            tags=[t.tag_ for t in read],
            sent_starts=[bool(t.is_sent_start) for t in read],
        )
