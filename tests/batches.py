"""A `TokenBatch` with each token its own type row, for the tests and the
benchmark (benchmarks/char_cnn_per_word.py) that compare it with the
package's batches, which encode each distinct token once."""

import torch

from elmo_spacy.bilm.inputs.batch import BOS_TYPE, EOS_TYPE, TokenBatch


def per_token(batch: TokenBatch) -> TokenBatch:
    """The same batch with each token its own type row (as if no two tokens
    were alike): the same layers and loss up to float rounding."""
    steps = batch.index.shape[1] - 2
    real = torch.arange(steps)[None, :] < batch.lengths[:, None]  # (B, T)
    rows = batch.index[:, 1:-1][real]  # the type of each real token, in order
    index = batch.index.clone()
    inner = index[:, 1:-1]
    inner[real] = torch.arange(2, 2 + len(rows))
    index[:, 1:-1] = inner
    keep = torch.cat([torch.tensor([BOS_TYPE, EOS_TYPE]), rows])
    types = [batch.types[r - 2] for r in rows.tolist()] if batch.types else ()
    return TokenBatch(
        batch.type_inputs[keep],
        batch.type_chars[keep],
        batch.type_word_ids[keep],
        index,
        batch.lengths,
        types,
        batch.targets,  # positions and words: the same
    )
