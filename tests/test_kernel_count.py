"""benchmarks/kernel_count.py on narrow models: what the concatenated residual attention is for.
Its training step dispatches fewer operations than the eager chain's and the fused one's, fewer
than ADMIN's without residual attention at all, and keeps no more for backward than the eager
chain when each attention call keeps what a fused GPU kernel keeps."""

import pytest

from .cli import BENCHMARKS, load_script


@pytest.fixture(scope="module")
def counted():
    host_time = load_script("host_time", BENCHMARKS)
    kernel_count = load_script("kernel_count", BENCHMARKS)
    found = {}
    for variant in ("admin", "realformer+eager", "realformer+fused", "realformer+concat"):
        bench = host_time.Narrow(variant, 6, 16, "fp32")
        counting = kernel_count.Counting()
        bench.train(counting)
        found[variant] = {
            "ops": sum(counting.counts.values()),
            "by_name": counting.counts,
            "saved_gpu": kernel_count.saved_for_backward_bytes(bench.model, bench.sample, as_on_a_gpu=True),
        }
    return found


def test_concat_dispatches_the_fewest_operations(counted):
    ops = {variant: c["ops"] for variant, c in counted.items()}
    assert ops["realformer+concat"] < ops["admin"] < ops["realformer+fused"] < ops["realformer+eager"]
    # one attention call per layer forward and one backward (6 encoder, 6 + 6 decoder layers), but
    # the last cross-attention: fairseq's decoder asks it for its probabilities (the alignment), which
    # the eager chain answers over the concatenations, as under every kernel
    by_name = counted["realformer+concat"]["by_name"]
    assert by_name["fused_attention"] == by_name["fused_attention_backward"] == 17
    assert by_name["_softmax"] == by_name["_softmax_backward_data"] == 1


def test_concat_keeps_less_for_backward_than_the_eager_chain_as_gpu_kernels_keep(counted):
    assert counted["realformer+concat"]["saved_gpu"] < counted["realformer+eager"]["saved_gpu"]
