"""What a biLM derives from one version of its weights to run faster at
inference (`InferenceCache`), and how it knows the version."""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..inputs.batch import TokenBatch
from ..inputs.chars import CharIds
from ..inputs.vocab import PAD_ID
from ..model.lstm import ProductOf
from ..model.network import States
from . import kernels
from .kernels import PackedWeights
from .lru import LruCache
from .products import onednn_packing

ENCODE_BLOCK = 32  # rows of the char CNN's fixed-shape blocks at inference


@dataclass
class InferenceCache:
    """What a biLM derives from one version (`stamp`) of its weights: (P,)
    encodings of token strings (`types`) and of <S> and </S> (`boundaries`),
    LSTM weights packed for oneDNN per layer, and `primed_states`."""

    stamp: tuple
    types: LruCache[str, torch.Tensor]
    boundaries: torch.Tensor | None = None
    packed: PackedWeights = field(default_factory=dict)
    primed: dict[tuple, States] = field(default_factory=dict)


class InferenceCacheSlot:
    """Holds a module's `InferenceCache`, that of the last version of its
    weights asked for (`cache`, or None)."""

    def __init__(self, type_cache_size: int) -> None:
        self.type_cache_size = type_cache_size  # the bound of the caches' `types`
        self.cache: InferenceCache | None = None
        self._generation = 0  # counts weights_changed()

    def for_weights(self, module: nn.Module) -> InferenceCache | None:
        """The cache of `module`'s current weights (new when a parameter's
        storage or version changed, or `weights_changed` was called); None in
        training mode or with gradients."""
        if module.training or torch.is_grad_enabled():
            return None
        stamp = (self._generation, tuple((p.data_ptr(), p._version) for p in module.parameters()))
        if self.cache is None or self.cache.stamp != stamp:
            self.cache = InferenceCache(stamp, LruCache(self.type_cache_size))
        return self.cache

    def weights_changed(self) -> None:
        self._generation += 1
        self.cache = None

    def info(self) -> dict[str, int]:
        """How many token encodings, primed states and packed layers it holds."""
        cache = self.cache
        if cache is None:
            return {"types": 0, "primed": 0, "packed": 0}
        return {"types": len(cache.types), "primed": len(cache.primed), "packed": len(cache.packed)}

    def __getstate__(self) -> dict:
        # oneDNN's packed tensors cannot be copied; the cache is rebuilt on demand
        return {**self.__dict__, "cache": None}


def packed_products_of(
    cache: InferenceCache | None, weight: torch.Tensor
) -> Callable[[nn.LSTM], ProductOf] | None:
    """Each LSTM layer's products on weights oneDNN packed once, kept in the
    cache, where oneDNN packs weights like `weight` (float32, on the CPU);
    else None."""
    can_pack = weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_packing()
    if cache is None or not can_pack:
        return None
    return lambda layer: kernels.packed_products(cache.packed.setdefault(id(layer), {}))


def encode_types(
    encoder: nn.Module, chars: CharIds | None, batch: TokenBatch, cache: InferenceCache | None
) -> torch.Tensor:
    """(U, P) encodings of the batch's types, kept in the cache with an
    encoder that reads characters on the CPU (on a GPU the encoder costs
    less than the bookkeeping)."""
    keeps = cache is not None and chars is not None and cache.types.max_size > 0
    if not (keeps and batch.types and batch.type_inputs.device.type == "cpu"):
        return encoder(batch.type_inputs, batch.type_chars, batch.type_word_ids)
    encoded = [cache.types.get(t) for t in batch.types]
    missing = [i for i, e in enumerate(encoded) if e is None]
    rows = [0, 1] if cache.boundaries is None else []
    rows += [i + 2 for i in missing]
    if rows:
        rows = torch.tensor(rows, device=batch.type_inputs.device)
        fresh = encode_alike(
            encoder,
            chars,
            batch.type_inputs[rows],
            batch.type_chars[rows],
            batch.type_word_ids[rows],
        )
        if cache.boundaries is None:
            cache.boundaries, fresh = fresh[:2].clone(), fresh[2:]
        for i, row in zip(missing, fresh):
            encoded[i] = row.clone()
    for t, row in zip(batch.types, encoded):
        cache.types.put(t, row)
    return torch.cat([cache.boundaries, torch.stack(encoded)])


def encode_alike(
    encoder: nn.Module,
    chars: CharIds,
    char_ids: torch.Tensor,
    n_chars: torch.Tensor,
    word_ids: torch.Tensor,
) -> torch.Tensor:
    """(U, W), (U,), (U,) -> (U, P), in blocks of one fixed shape, so that a
    type's encoding is the same to the bit whatever its batch."""
    n_rows, width = char_ids.shape
    blocks = -(-n_rows // ENCODE_BLOCK)
    padded = char_ids.new_full((blocks * ENCODE_BLOCK, chars.max_chars), chars.padding)
    padded[:n_rows, :width] = char_ids
    lengths = n_chars.new_full((blocks * ENCODE_BLOCK,), 1)
    lengths[:n_rows] = n_chars
    words = word_ids.new_full((blocks * ENCODE_BLOCK,), PAD_ID)
    words[:n_rows] = word_ids
    encoded = [
        encoder(*(x[i : i + ENCODE_BLOCK] for x in (padded, lengths, words)))
        for i in range(0, len(padded), ENCODE_BLOCK)
    ]
    return torch.cat(encoded)[:n_rows]
