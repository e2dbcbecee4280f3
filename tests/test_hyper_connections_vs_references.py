"""The plugin's Hyper-Connections and mHC (fairseq_realformer/modules/hyper_connections.py) against
their authors' code: lucidrains' hyper-connections 0.4.11 (HC and mHC) and x-transformers 2.12.2
(HC), weights copied across, a stand-in branch (a small MLP, the same module on both sides), n
streams of width C through a chain of three sublayers from the expanded input to the streams'
sum: the same outputs and gradients (of the input, the branches and every connection weight), to
float32's rounding. Test dependencies (requirements.txt); without them these tests skip.

Where the references differ from the papers, and the comparison is made like for like:
- hyper-connections normalises the streams with its RMSNorm where the HC paper (and the plugin)
  has LayerNorm: its norm module is put into the plugin's connection. x-transformers 2.12.2 has
  the paper's LayerNorm (without bias): the plugin's own LayerNorm gets its weight and bias 0.
- hyper-connections' mHC starts its write logits at 1 (writes 2σ(1) = 1.46), the plugin's at 0
  (2σ(0) = 1, Pre-LN's write): compared after the weights are copied; the initial values are
  checked where they agree and where they do not.
- x-transformers from 2.14.1 on replaced its HC by an mHC whose stream mix reshapes a stream's row
  into a 1×n matrix before Sinkhorn-Knopp, so every mix entry is 1 and the mix gets no gradient
  (2.31.10 still): that is why 2.12.2, the last HC before it, is the one pinned.
"""

from importlib import metadata

import pytest
import torch
from torch import nn

from fairseq_realformer.modules.hyper_connections import HyperConnection, collapse, widen

from .helpers import rounding

N, C, T, B = 4, 16, 5, 3
SUBLAYERS = 3


def reference_package(module, distribution, version):
    """*module* of *distribution* at the *version* the tests were written against, else skip."""
    found = pytest.importorskip(module)
    if metadata.version(distribution) != version:
        pytest.skip(f"{distribution} {metadata.version(distribution)} installed; these tests compare with {version}")
    return found


def hyper_connections():
    return reference_package("hyper_connections", "hyper-connections", "0.4.11")


def x_transformers():
    return reference_package("x_transformers.x_transformers", "x-transformers", "2.12.2")


def branches(seed=0):
    """The stand-in sublayers: a small MLP each, shared by both sides."""
    torch.manual_seed(seed)
    return nn.ModuleList(nn.Sequential(nn.Linear(C, 2 * C), nn.GELU(), nn.Linear(2 * C, C)) for _ in range(SUBLAYERS))


@torch.no_grad()
def perturb(*modules, seed=1):
    """Every weight moved off its initial value (zero dynamic weights would hide their terms)."""
    g = torch.Generator().manual_seed(seed)
    for module in modules:
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)


def to_reference_layout(streams):
    """(T, B, n, C) -> lucidrains' ((B n), T, C): the streams folded into the batch."""
    return streams.permute(1, 2, 0, 3).reshape(B * N, T, C)


def plugin_chain(connections, blocks, x):
    """x (T, B, C) through the plugin's connections around *blocks*; the streams' sum."""
    streams = widen(x, N)
    for connection, block in zip(connections, blocks):
        branch_input, widened = connection.width_connection(streams)
        streams = connection.depth_connection(block(branch_input), widened)
    return collapse(streams)


def assert_same(reference_run, plugin_run, reference_weights, plugin_weights, blocks):
    """Both chains on one input: the same output, and the same gradients of a random projection of
    it with respect to the input, the branches' weights and each pair of connection weights."""
    torch.manual_seed(2)
    x = torch.randn(T, B, C, requires_grad=True)
    probe = torch.randn(T, B, C)
    results = []
    for run, weights in ((reference_run, reference_weights), (plugin_run, plugin_weights)):
        out = run(x)
        groups = [[t] for t in (x, *blocks.parameters())] + [list(w) if isinstance(w, tuple) else [w] for w in weights]
        grads = iter(torch.autograd.grad((out * probe).sum(), [t for group in groups for t in group]))
        # a tuple of weights is one of the other side's: its gradients side by side
        results.append((out.detach(), [torch.cat([next(grads).reshape(-1) for _ in group]) for group in groups]))
    (want, want_grads), (got, got_grads) = results
    # float32's rounding through the chain: per sublayer the norm, the dynamic weights' products
    # and the branch over C, its hidden layer (2C), the read and the mix over n, Sinkhorn's sums
    sums = SUBLAYERS * [C, C, C, 2 * C, N, N, 2 * 20 * N]
    torch.testing.assert_close(got, want, rtol=0, atol=rounding(*sums, scale=want.abs().max()))
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        assert want_grad.abs().sum() > 0
        atol = rounding(*sums, *sums, scale=want_grad.abs().max())  # forward and back
        torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=atol)


# --- hyper-connections 0.4.11 -----------------------------------------------------------------------


def lucidrains_pair(mix, dynamic, index):
    """hyper-connections' connection of sublayer *index* and the plugin's, with the reference's
    weights copied into the plugin's; (reference, plugin, their weights side by side)."""
    hc = hyper_connections()
    if mix == "hc":
        reference = hc.HyperConnections(N, dim=C, layer_index=index, tanh=True)
        alpha_scale = [reference.dynamic_alpha_scale]
        beta_scale = reference.dynamic_beta_scale
        alpha_fn = reference.dynamic_alpha_fn
    else:
        reference = hc.ManifoldConstrainedHyperConnections(N, dim=C, layer_index=index, sinkhorn_iters=20)
        alpha_scale = [reference.pre_branch_scale, reference.residual_scale]  # the paper's α^pre, α^res
        beta_scale = reference.h_post_scale  # α^post
        alpha_fn = reference.dynamic_alpha_fn  # (proposals = 1, C, 1 + n)
    plugin = HyperConnection(N, C, index, mix=mix, dynamic=dynamic)
    assert torch.equal(plugin.static_alpha, reference.static_alpha)  # [e_k | I]: the same start
    perturb(reference)
    if not dynamic:  # SHC: the reference's dynamic weights at zero leave its static ones alone
        with torch.no_grad():
            alpha_fn.zero_(), reference.dynamic_beta_fn.zero_()
    pairs = [(reference.static_alpha, plugin.static_alpha), (reference.static_beta, plugin.static_beta)]
    if dynamic:
        plugin.norm = reference.norm  # RMSNorm, where the paper (and the plugin) has LayerNorm
        pairs += [
            (alpha_fn, plugin.dynamic_alpha_fn),
            (reference.dynamic_beta_fn, plugin.dynamic_beta_fn),
            (beta_scale, plugin.dynamic_beta_scale),
        ]
    with torch.no_grad():
        for theirs, ours in pairs:
            ours.copy_(theirs.reshape(ours.shape))
        if dynamic:
            plugin.dynamic_alpha_scale.copy_(torch.cat([s.reshape(1) for s in alpha_scale]))
    reference_weights = [theirs for theirs, _ in pairs] + ([tuple(alpha_scale)] if dynamic else [])
    plugin_weights = [ours for _, ours in pairs] + ([plugin.dynamic_alpha_scale] if dynamic else [])
    return reference, plugin, reference_weights, plugin_weights


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
@pytest.mark.parametrize("mix", ["hc", "mhc"])
def test_same_as_hyper_connections(mix, dynamic):
    hc = hyper_connections()
    triples = [lucidrains_pair(mix, dynamic, index) for index in range(SUBLAYERS)]
    references, plugins = [t[0] for t in triples], [t[1] for t in triples]
    get_functions = hc.get_init_and_expand_reduce_stream_functions
    if mix == "mhc":
        get_functions = hc.mc_get_init_and_expand_reduce_stream_functions
    _, expand, reduce = get_functions(N)
    blocks = branches()

    def reference_run(x):
        streams = expand(x.transpose(0, 1))  # (B, T, C) -> ((B n), T, C)
        for reference, block in zip(references, blocks):
            branch_input, add_residual = reference(streams)
            streams = add_residual(block(branch_input))
        return reduce(streams).transpose(0, 1)

    assert_same(
        reference_run,
        lambda x: plugin_chain(plugins, blocks, x),
        [w for t in triples for w in t[2]],
        [w for t in triples for w in t[3]],
        blocks,
    )


def test_initial_weights_where_they_agree_with_hyper_connections_and_where_not():
    """HC: the same start ([e_k | I], B = 1, dynamic weights 0, scales 0.01). mHC: the same but the
    writes' logit, 1 in hyper-connections (B = 1.46), 0 in the plugin (B = 1, as Pre-LN)."""
    hc = hyper_connections()
    for index in range(5):
        reference, plugin = hc.HyperConnections(N, dim=C, layer_index=index), HyperConnection(N, C, index)
        for name in ("static_alpha", "static_beta", "dynamic_alpha_fn", "dynamic_beta_fn"):
            assert torch.equal(getattr(plugin, name), getattr(reference, name)), name
        for name in ("dynamic_alpha_scale", "dynamic_beta_scale"):
            assert torch.equal(getattr(plugin, name), getattr(reference, name).reshape(1)), name
        reference = hc.ManifoldConstrainedHyperConnections(N, dim=C, layer_index=index)
        plugin = HyperConnection(N, C, index, mix="mhc")
        assert torch.equal(plugin.static_alpha, reference.static_alpha)
        assert torch.equal(reference.static_beta, torch.ones(N)) and torch.equal(plugin.static_beta, torch.zeros(N))
        assert torch.equal(plugin.dynamic_alpha_fn, reference.dynamic_alpha_fn[0])
        scales = torch.cat([reference.pre_branch_scale, reference.residual_scale])
        assert torch.equal(plugin.dynamic_alpha_scale, scales)
        assert torch.equal(plugin.dynamic_beta_scale, reference.h_post_scale.reshape(1))


# --- x-transformers 2.12.2 -------------------------------------------------------------------------


def test_same_as_x_transformers_with_the_papers_layer_norm():
    xt = x_transformers()
    references = [xt.HyperConnection(C, layer_index=index, num_residual_streams=N) for index in range(SUBLAYERS)]
    perturb(*references)
    plugins, reference_weights, plugin_weights = [], [], []
    for index, reference in enumerate(references):
        plugin = HyperConnection(N, C, index)
        with torch.no_grad():
            plugin.norm.bias.zero_()  # x-transformers' LayerNorm has no bias
            for name in ("static_alpha", "static_beta", "dynamic_alpha_fn", "dynamic_beta_fn", "norm.weight"):
                plugin.get_parameter(name).copy_(reference.get_parameter(name))
            for name in ("dynamic_alpha_scale", "dynamic_beta_scale"):
                plugin.get_parameter(name).copy_(reference.get_parameter(name).reshape(1))
        plugins.append(plugin)
        names = ["static_alpha", "static_beta", "dynamic_alpha_fn", "dynamic_beta_fn", "norm.weight"]
        names += ["dynamic_alpha_scale", "dynamic_beta_scale"]
        reference_weights += [reference.get_parameter(name) for name in names]
        plugin_weights += [plugin.get_parameter(name) for name in names]
    blocks = branches()

    def reference_run(x):
        streams = x.transpose(0, 1).repeat_interleave(N, dim=0)  # ((B n), T, C), as its stream_emb (zero) adds
        for reference, block in zip(references, blocks):
            branch_input, residuals, kwargs = reference.prepare(streams)
            streams = reference(block(branch_input), residuals, **kwargs)
        return streams.view(B, N, T, C).sum(dim=1).transpose(0, 1)

    assert_same(reference_run, lambda x: plugin_chain(plugins, blocks, x), reference_weights, plugin_weights, blocks)


def test_each_sublayer_first_reads_the_stream_x_transformers_gives_it():
    """The k-th residual sublayer of a stack (x-transformers counts attention, cross-attention and
    FFN blocks in the order they run) first reads stream k mod n, in a decoder with cross-attention
    as in an encoder."""
    xt = x_transformers()
    from .helpers import make_dictionary, realformer

    model = realformer(
        "all", "mean", "pre-ln", "--residual-streams", "4", "--decoder-layers", "2", dictionary=make_dictionary()
    )
    for side, theirs in (
        ("encoder", xt.Encoder(dim=C, depth=3, heads=2, num_residual_streams=N)),
        ("decoder", xt.Decoder(dim=C, depth=2, heads=2, cross_attend=True, num_residual_streams=N)),
    ):
        ours = [m for m in getattr(model, side).modules() if isinstance(m, HyperConnection)]
        reads = [residual.static_alpha[:, 0] for _, _, residual in theirs.layers]
        assert len(ours) == len(reads) == 6  # 3 layers of 2 sublayers, 2 of 3
        for connection, read in zip(ours, reads):
            assert torch.equal(connection.static_alpha[:, 0], read)
