"""fairseq's batching keeps every sentence once the plugin is imported (fairseq #5036)."""
import numpy as np
import pytest
from fairseq.data import data_utils

import fairseq_realformer  # noqa: F401  (installs the fix)


@pytest.mark.parametrize("n", [1, 7, 20, 21, 1003])
@pytest.mark.parametrize("max_tokens, max_sentences", [(None, 1), (None, 8), (None, 20), (120, None), (300, 16)])
def test_every_index_is_batched_exactly_once_in_order(n, max_tokens, max_sentences):
    lengths = np.random.default_rng(n).integers(1, 30, n)
    indices = np.argsort(lengths, kind="mergesort")
    batches = data_utils.batch_by_size(
        indices, lambda i: lengths[i], max_tokens=max_tokens, max_sentences=max_sentences,
        required_batch_size_multiple=8,
    )  # fmt: skip
    assert np.array_equal(np.concatenate(batches), indices)
    for batch in batches:
        if max_sentences:
            assert len(batch) <= max_sentences
        if max_tokens:
            assert len(batch) * lengths[batch].max() <= max_tokens
