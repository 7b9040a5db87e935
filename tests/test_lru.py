"""The one bounded cache (`LruCache`) and the caches bounded by it."""

import copy
import operator
import pickle

import numpy
import pytest
import spacy
import torch
from thinc.api import NumpyOps

from elmo_spacy.bilm import BiLM, WordVocab
from elmo_spacy.bilm.inputs.chars import MaskedCharIds
from elmo_spacy.bilm.runtime.lru import LruCache
from elmo_spacy.pipeline import FrozenOutputCache

from .conftest import TINY_BILM


def test_the_least_recently_used_entry_goes_first():
    cache = LruCache(3)
    for key in "abc":
        cache.put(key, key.upper())
    assert cache.get("a") == "A"  # a is now the most recently used
    cache.put("d", "D")
    assert list(cache) == ["c", "a", "d"] and "b" not in cache
    cache.put("c", "C2")  # storing again is a use, and replaces the value
    cache.put("e", "E")
    assert list(cache) == ["d", "c", "e"] and cache.get("c") == "C2"
    assert len(cache) == cache.size == 3


def test_hits_and_misses_count_lookups_and_outlive_clear():
    cache = LruCache(2)
    assert cache.get("a") is None
    cache.put("a", 1)
    assert cache.get("a") == 1 and cache.get("a") == 1 and cache.get("b") is None
    assert "a" in cache and "b" not in cache  # membership is no lookup
    assert (cache.hits, cache.misses) == (2, 2)
    cache.clear()
    assert len(cache) == cache.size == 0 and (cache.hits, cache.misses) == (2, 2)


def test_a_byte_bound_counts_the_sizes_and_drops_an_entry_larger_than_it():
    cache = LruCache(100, size_of=operator.attrgetter("nbytes"))
    arrays = {key: numpy.zeros(n, dtype="uint8") for key, n in (("a", 40), ("b", 40), ("c", 30))}
    for key, array in arrays.items():
        cache.put(key, array)
    assert list(cache) == ["b", "c"] and cache.size == 70
    cache.put("b", numpy.zeros(10, dtype="uint8"))  # a smaller value: the size follows
    assert cache.size == 40
    cache.put("huge", numpy.zeros(101, dtype="uint8"))  # alone past the bound: kept by none
    assert "huge" not in cache and len(cache) == 0 and cache.size == 0


@pytest.mark.parametrize("size_of", [None, len])
def test_a_lower_bound_holds_at_once_and_zero_keeps_nothing(size_of):
    cache = LruCache(10, size_of=size_of)
    for key in "abcde":
        cache.put(key, key * 2)
    cache.max_size = 4 if size_of else 2
    assert list(cache) == ["d", "e"]
    cache.max_size = 0
    cache.put("f", "ff")
    assert len(cache) == cache.size == 0


def test_char_ids_of_a_batch_are_each_tokens_own():
    """Vectorised over the batch, without a cache: each row is the token's ids."""
    chars = MaskedCharIds(max_chars=10, min_width=3)
    ids, lengths = chars.char_ids(["river", "", "x" * 20, "é"])
    numpy.testing.assert_array_equal(chars.token_ids("river"), [257, 115, 106, 119, 102, 115, 258])
    assert lengths.tolist() == [3, 3, 7, 2, 10, 4]
    assert ids[4].tolist() == [257, *[121] * 8, 258]  # cut to max_chars
    assert ids[5, :4].tolist() == [257, 0xC3 + 1, 0xA9 + 1, 258] and ids.shape[1] == 10


def test_the_frozen_output_cache_is_bounded_by_bytes():
    nlp = spacy.blank("en")
    docs = [nlp(text) for text in ("one two", "three four", "five six", "one two")]
    computed = []

    def compute(batch):
        computed.extend(doc.text for doc in batch)
        return [numpy.full((3, len(doc), 4), float(len(doc.text)), "float32") for doc in batch]

    entry_bytes = 3 * 2 * 4 * 2  # (L + 1, n, width) in float16
    cache = FrozenOutputCache(2 * entry_bytes)
    assert isinstance(cache, LruCache)
    outputs = cache.get_or_compute(docs[:3], compute, NumpyOps())
    assert [o.dtype for o in outputs] == ["float32"] * 3 and outputs[2][0, 0, 0] == 8.0
    assert len(cache) == 2 and cache.size == 2 * entry_bytes  # "one two" dropped
    cache.get_or_compute(docs[2:], compute, NumpyOps())  # "five six" kept; "one two" again
    assert computed == ["one two", "three four", "five six", "one two"]
    assert (cache.hits, cache.misses) == (1, 4)
    cache.max_size = entry_bytes
    assert len(cache) == 1 and cache.size == entry_bytes
    cache.clear()
    assert len(cache) == cache.size == 0 and cache.hits == 1


def test_the_type_encodings_are_bounded_by_count_and_the_batch_is_kept_last():
    torch.manual_seed(0)
    bilm = BiLM(TINY_BILM, WordVocab.specials_only(), with_softmax=False, type_cache_size=4).eval()

    def run(*docs):
        with torch.inference_mode():
            bilm(bilm.batch([doc.split() for doc in docs]))
        return bilm.cache_slot.cache.types

    types = run("a b c", "d")
    assert isinstance(types, LruCache) and types.max_size == 4
    assert list(types) == ["a", "b", "c", "d"] and (types.hits, types.misses) == (0, 4)
    types = run("c e")  # c found; e computed; a, the least recently used, dropped
    assert list(types) == ["b", "d", "c", "e"] and (types.hits, types.misses) == (1, 5)
    assert bilm.cache_info()["types"] == 4
    bilm.type_cache_size = 2  # holds at once
    assert list(types) == ["c", "e"]
    # Copies and pickles leave what was derived from the weights out.
    for twin in (copy.deepcopy(bilm), pickle.loads(pickle.dumps(bilm))):
        assert twin.cache_slot.cache is None and twin.type_cache_size == 2
    assert bilm.cache_slot.cache is not None
