"""Corpus readers and converters."""

from .agnews import (
    CLASS_NAMES,
    BadRowError,
    ChecksumError,
    check_known_file,
    clean_text,
    read_agnews_csv,
    stratified_split,
)
from .corpus import build_corpus
from .texts import read_texts, read_tokenised_texts

__all__ = [
    "CLASS_NAMES",
    "BadRowError",
    "ChecksumError",
    "check_known_file",
    "build_corpus",
    "clean_text",
    "read_agnews_csv",
    "read_texts",
    "read_tokenised_texts",
    "stratified_split",
]
