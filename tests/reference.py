"""An independent reference for the RealFormer encoder-decoder, written from the equations.

It shares no code with the plugin: it reads the model's parameters by name and recomputes
everything with plain tensor algebra, batch x heads x query x key, one head dimension per
index. Only the token/position embedding modules (fairseq's, not ours) are called.

    S_n = Q_n K_nᵀ / √d + S_{n-1}                 (S_0 = 0; carried only on a residual path)
    P_n = softmax(mask(S_n))           (sum)
    P_n = softmax(mask(S_n / n))       (mean)
    post-ln: LN(x + f(x))   pre-ln: x + f(LN(x))   admin: LN(x·ω + f(x))   deepnorm: LN(α·x + f(x))
    rezero: x + α·f(x) (α the sublayer's trainable scalar)   t-fixup: x + f(x)
    resi-dual: x ← LN(x + f(x)) and d ← d + f(x), d₀ the embedded input; stack output x + LN(d)

Residual streams (Hyper-Connections, pre-ln): H (B, T, n, C) starts as n copies of the embedded
input; each sublayer reads h₀ = Σ_s A_m[s]·H_s and sets H_t ← Σ_s A_r[s, t]·H_s + B_t·f(LN(h₀)),
with [A_m | A_r] = static + s_α·tanh(LN(H_s)·W_α) per stream s (dynamic; static: the parameter
alone) and B likewise; mhc: no tanh, A_m = σ(·), A_r = exp(·) with columns then rows divided by
their sums t times, B = 2σ(·). The stack outputs LN(Σ_s H_s).

Value residual on a path: layer n ≥ 2 reads V' = λ·V_n + (1 − λ)·V_1, V_1 the first layer's values
(of the layers run), λ = ½ (half) or sigmoid(x·w + b) per token and head (learned), x the
sublayer's query input. Self-attention: token s's λ mixes token s's values; cross-attention: query
t's λ mixes every value query t reads.

Depth-weighted averages (DenseFormer, dilation k, period p): X_0 the embedded input, X_i layer i's
output (from 1); after layer i the stack hands on Y_i = Σ_j α_{i,j} X_j over j = i, i − k, ... ≥ 0
when p divides i, else X_i; the last layer's Y is the stack's x. A layer LayerDrop skips outputs
its input, and is averaged after as any other.

With ``profile=True`` it also recomputes ADMIN's profiling: ω_i = ratio, then
ratio = sqrt(Var(x·ω_i) + Var(f(x))) over the real tokens, ratio starting at 1 per stack.
"""

import math
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


def _linear(x, params, name):
    return x @ params[f"{name}.weight"].T + params[f"{name}.bias"]


def _layer_norm(x, params, name, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], params[f"{name}.weight"], params[f"{name}.bias"], eps=eps)


RESIDUAL_EPS = 1e-7  # ResiDual's stack LayerNorm (microsoft/ResiDual)


class Dual:
    """ResiDual's dual stream d of one stack."""

    def __init__(self, embedded):
        self.d = embedded


class Streams:
    """The residual streams of one stack (Hyper-Connections): ``n`` of them, ``mix`` "hc" or "mhc",
    ``iterations`` of Sinkhorn-Knopp for mhc."""

    def __init__(self, n, mix, iterations):
        self.n, self.mix, self.iterations = n, mix, iterations

    def widen(self, x):
        return torch.stack([x] * self.n, dim=2)  # (B, T, n, C)

    def weights(self, H, params, name):
        """[A_m | A_r] (..., n, 1 + n) and B (..., n) of the sublayer *name*."""
        alpha, beta = params[f"{name}.static_alpha"], params[f"{name}.static_beta"]
        if f"{name}.dynamic_alpha_fn" in params:
            normed = _layer_norm(H, params, f"{name}.norm")
            dynamic_alpha = torch.einsum("btsc,ce->btse", normed, params[f"{name}.dynamic_alpha_fn"])
            dynamic_beta = torch.einsum("btsc,c->bts", normed, params[f"{name}.dynamic_beta_fn"])
            scale = params[f"{name}.dynamic_alpha_scale"]
            if self.mix == "hc":
                dynamic_alpha, dynamic_beta = torch.tanh(dynamic_alpha), torch.tanh(dynamic_beta)
            else:  # α^pre for the reads, α^res for every column of the mix
                scale = torch.cat([scale[0:1]] + [scale[1:2]] * self.n)
            alpha = alpha + scale * dynamic_alpha
            beta = beta + params[f"{name}.dynamic_beta_scale"] * dynamic_beta
        if self.mix == "mhc":
            mix = torch.exp(alpha[..., 1:])
            for _ in range(self.iterations):
                mix = mix / mix.sum(dim=-2, keepdim=True)
                mix = mix / mix.sum(dim=-1, keepdim=True)
            alpha = torch.cat([torch.sigmoid(alpha[..., :1]), mix], dim=-1)
            beta = 2 * torch.sigmoid(beta)
        return alpha, beta

    def sublayer(self, H, f, params, ln_name, name):
        alpha, beta = self.weights(H, params, name)
        alpha = alpha.expand(*H.shape[:3], self.n + 1)
        read = torch.einsum("bts,btsc->btc", alpha[..., 0], H)
        mixed = torch.einsum("btsu,btsc->btuc", alpha[..., 1:], H)
        return mixed + beta.unsqueeze(-1) * f(_layer_norm(read, params, ln_name)).unsqueeze(2)

    def collapse(self, H):
        return H.sum(dim=2)


class Averages:
    """DenseFormer's depth-weighted averages of one stack (*side*), every layer's output kept."""

    def __init__(self, embedded, params, side, dilation, period):
        self.states, self.params, self.side = [embedded], params, side
        self.dilation, self.period = dilation, period

    def skip_to(self, i, x):
        """x through the layers LayerDrop skipped before layer *i* (from 0): identities."""
        while len(self.states) <= i:
            x = self.after(len(self.states) - 1, x)
        return x

    def after(self, i, x):
        """Y after layer *i* (from 0), its output *x*."""
        self.states.append(x)
        layer = i + 1
        if layer % self.period:
            return x
        alpha = self.params[f"{self.side}.dense_residual.alphas.{i}"]
        kept = range(layer % self.dilation, layer + 1, self.dilation)
        assert len(alpha) == len(kept)
        return sum(a * self.states[j] for a, j in zip(alpha, kept))


def value_mix(x, params, name, heads, mix):
    """λ (B, H, T, 1) for the tokens of x (B, T, C)."""
    if mix == "half":
        return torch.full((x.size(0), heads, x.size(1), 1), 0.5)
    gate = torch.sigmoid(x @ params[f"{name}.value_gate.weight"].T + params[f"{name}.value_gate.bias"])
    return gate.transpose(1, 2).unsqueeze(-1)


def attention(x_q, x_kv, params, name, heads, masked, prev, n, mode, first_values=None, mix=None):
    """One attention module. x_q (B, Tq, C), x_kv (B, Tk, C); masked (B, 1|Tq, Tk) bool;
    *first_values* V_1 (B, H, Tk, d) for value residual, mixed by *mix* ("half" or "learned").
    Returns (output (B, Tq, C), S_n (B, H, Tq, Tk), probabilities (B, H, Tq, Tk), V (B, H, Tk, d))."""
    B, Tq, C = x_q.shape
    Tk, d = x_kv.shape[1], C // heads

    def split(t, T):
        return t.view(B, T, heads, d).transpose(1, 2)  # (B, H, T, d)

    q = split(_linear(x_q, params, f"{name}.q_proj"), Tq)
    k = split(_linear(x_kv, params, f"{name}.k_proj"), Tk)
    v = split(_linear(x_kv, params, f"{name}.v_proj"), Tk)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d)
    if prev is not None:
        scores = scores + prev
    logits = scores / n if mode == "mean" else scores
    logits = logits.masked_fill(masked.unsqueeze(1), NEG_INF)
    probs = torch.softmax(logits, dim=-1)
    seen = v.unsqueeze(2).expand(B, heads, Tq, Tk, d)  # the values each query reads
    if first_values is not None:
        lam = value_mix(x_q, params, name, heads, mix)
        if x_q is x_kv:  # self-attention: each token's λ mixes its own values
            seen = (lam * v + (1 - lam) * first_values).unsqueeze(2).expand(B, heads, Tq, Tk, d)
        else:  # cross-attention: query t's λ mixes what t reads
            lam = lam.unsqueeze(-1)
            seen = lam * v.unsqueeze(2) + (1 - lam) * first_values.unsqueeze(2)
    out = torch.einsum("bhqk,bhqkd->bhqd", probs, seen).transpose(1, 2).reshape(B, Tq, C)
    return _linear(out, params, f"{name}.out_proj"), scores, probs, v


class Profile:
    """ADMIN's running ratio for one stack; *real* (B, T) marks real tokens."""

    def __init__(self, real):
        self.real, self.ratio, self.omegas = real, 1.0, []

    def omega(self, x, branch):
        omega = self.ratio
        self.omegas.append(omega)
        var = lambda t: t[self.real].var(unbiased=False).item()  # noqa: E731
        self.ratio = math.sqrt(var(x * omega) + var(branch))
        return omega


def residual_sublayer(x, f, params, ln_name, omega_name, backbone, alpha=None, profile=None, stack=None):
    """One residual sublayer f on *backbone*; *stack*: ResiDual's ``Dual`` or the residual ``Streams``."""
    if isinstance(stack, Streams):
        return stack.sublayer(x, f, params, ln_name, omega_name.replace("_omega", "_hyper_connection"))
    if backbone == "pre-ln":
        return x + f(_layer_norm(x, params, ln_name))
    branch = f(x)
    if stack is not None:
        stack.d = stack.d + branch
    if backbone == "rezero":
        return x + params[omega_name.replace("_omega", "_resweight")] * branch
    if backbone == "t-fixup":
        return x + branch
    if backbone == "admin":
        omega = profile.omega(x, branch) if profile else params[omega_name]
        return _layer_norm(x * omega + branch, params, ln_name)
    if backbone == "deepnorm":
        return _layer_norm(alpha * x + branch, params, ln_name)
    return _layer_norm(x + branch, params, ln_name)


def feed_forward(x, params, name):
    return _linear(torch.relu(_linear(x, params, f"{name}.fc1")), params, f"{name}.fc2")


def start_stack(embedded, backbone, streams, stream_mix, sinkhorn_iterations):
    """What a stack carries beside its layers' x: ResiDual's dual stream, or the residual streams."""
    if backbone == "resi-dual":
        return Dual(embedded)
    return Streams(streams, stream_mix, sinkhorn_iterations) if streams > 1 else None


def reference_forward(
    model,
    src_tokens,
    prev_output_tokens,
    *,
    paths,
    mode: str,
    backbone: str,
    heads: int,
    encoder_layers: Optional[Sequence[int]] = None,
    decoder_layers: Optional[Sequence[int]] = None,
    profile: bool = False,
    value_paths=(),
    value_mix: str = "half",
    streams: int = 1,
    stream_mix: str = "hc",
    sinkhorn_iterations: int = 20,
    dense: Optional[Tuple[int, int]] = None,
) -> Dict[str, torch.Tensor]:
    """Encoder output (B, S, C), decoder logits (B, T, V) and every layer's carried scores.

    *encoder_layers* / *decoder_layers* list the layer indices to run (all by default), to
    emulate LayerDrop: n then counts the layers actually run. *dense*: (dilation, period) of the
    depth-weighted averages.
    """
    params = dict(model.state_dict())

    def path_mode(path):  # a path that is off is plain attention: no carry, no temperature
        return mode if path in paths else "sum"

    first_values = {}  # V_1 by value-residual path

    def attend(path, x_q, x_kv, name, masked, prev, n):
        """attention() on *path*, with V_1 handed on along a value-residual path."""
        out = attention(
            x_q, x_kv, params, name, heads, masked, prev, n, path_mode(path), first_values.get(path), value_mix
        )
        if path in value_paths and path not in first_values:
            first_values[path] = out[3]
        return out[:3]

    enc, dec = model.encoder, model.decoder
    pad = enc.padding_idx
    n_enc = sum(1 for k in params if k.endswith("self_attn.q_proj.weight") and k.startswith("encoder."))
    n_dec = sum(1 for k in params if k.endswith("self_attn.q_proj.weight") and k.startswith("decoder."))
    encoder_layers = range(n_enc) if encoder_layers is None else encoder_layers
    decoder_layers = range(n_dec) if decoder_layers is None else decoder_layers
    # DeepNet's α for an encoder-decoder (N encoder, M decoder layers)
    enc_alpha, dec_alpha = 0.81 * (n_enc**4 * n_dec) ** (1 / 16), (3 * n_dec) ** (1 / 4)
    enc_profile = Profile(~src_tokens.eq(pad)) if profile else None
    dec_profile = Profile(~prev_output_tokens.eq(pad)) if profile else None

    # Encoder
    src_pad = src_tokens.eq(pad)  # (B, S)
    x = enc.embed_scale * enc.embed_tokens(src_tokens) + enc.embed_positions(src_tokens)
    x = x * (~src_pad).unsqueeze(-1)
    stack = start_stack(x, backbone, streams, stream_mix, sinkhorn_iterations)
    x = stack.widen(x) if isinstance(stack, Streams) else x
    averages = Averages(x, params, "encoder", *dense) if dense else None
    carried, out = None, {"encoder_scores": [], "decoder_scores": [], "cross_scores": []}
    for n, i in enumerate(encoder_layers, start=1):
        p = f"encoder.layers.{i}"
        x = averages.skip_to(i, x) if averages else x

        def self_attn(h):
            nonlocal carried
            o, s, _ = attend("encoder", h, h, f"{p}.self_attn", src_pad.unsqueeze(1), carried, n)
            carried = s if "encoder" in paths else None
            out["encoder_scores"].append(s)
            return o

        x = residual_sublayer(
            x,
            self_attn,
            params,
            f"{p}.self_attn_layer_norm",
            f"{p}.self_attn_omega",
            backbone,
            enc_alpha,
            enc_profile,
            stack,
        )
        x = residual_sublayer(
            x,
            lambda h: feed_forward(h, params, p),
            params,
            f"{p}.final_layer_norm",
            f"{p}.ffn_omega",
            backbone,
            enc_alpha,
            enc_profile,
            stack,
        )
        x = averages.after(i, x) if averages else x
    x = averages.skip_to(n_enc, x) if averages else x
    if backbone == "pre-ln":
        x = _layer_norm(stack.collapse(x) if isinstance(stack, Streams) else x, params, "encoder.layer_norm")
    if backbone == "resi-dual":
        x = x + _layer_norm(stack.d, params, "encoder.layer_norm", eps=RESIDUAL_EPS)
    encoder_out = x

    # Decoder
    T = prev_output_tokens.size(1)
    future = torch.ones(T, T, dtype=torch.bool).triu(1).unsqueeze(0)  # (1, T, T)
    self_masked = future | prev_output_tokens.eq(pad).unsqueeze(1)
    y = dec.embed_scale * dec.embed_tokens(prev_output_tokens) + dec.embed_positions(prev_output_tokens)
    stack = start_stack(y, backbone, streams, stream_mix, sinkhorn_iterations)
    y = stack.widen(y) if isinstance(stack, Streams) else y
    averages = Averages(y, params, "decoder", *dense) if dense else None
    self_carried = cross_carried = None
    for n, i in enumerate(decoder_layers, start=1):
        p = f"decoder.layers.{i}"
        y = averages.skip_to(i, y) if averages else y

        def self_attn(h):
            nonlocal self_carried
            o, s, _ = attend("decoder", h, h, f"{p}.self_attn", self_masked, self_carried, n)
            self_carried = s if "decoder" in paths else None
            out["decoder_scores"].append(s)
            return o

        def cross_attn(h):
            nonlocal cross_carried
            o, s, probs = attend("cross", h, encoder_out, f"{p}.encoder_attn", src_pad.unsqueeze(1), cross_carried, n)
            cross_carried = s if "cross" in paths else None
            out["cross_scores"].append(s)
            out["cross_probs"] = probs
            return o

        y = residual_sublayer(
            y,
            self_attn,
            params,
            f"{p}.self_attn_layer_norm",
            f"{p}.self_attn_omega",
            backbone,
            dec_alpha,
            dec_profile,
            stack,
        )
        y = residual_sublayer(
            y,
            cross_attn,
            params,
            f"{p}.encoder_attn_layer_norm",
            f"{p}.encoder_attn_omega",
            backbone,
            dec_alpha,
            dec_profile,
            stack,
        )
        y = residual_sublayer(
            y,
            lambda h: feed_forward(h, params, p),
            params,
            f"{p}.final_layer_norm",
            f"{p}.ffn_omega",
            backbone,
            dec_alpha,
            dec_profile,
            stack,
        )
        y = averages.after(i, y) if averages else y
    y = averages.skip_to(n_dec, y) if averages else y
    if backbone == "pre-ln":
        y = _layer_norm(stack.collapse(y) if isinstance(stack, Streams) else y, params, "decoder.layer_norm")
    if backbone == "resi-dual":
        y = y + _layer_norm(stack.d, params, "decoder.layer_norm", eps=RESIDUAL_EPS)
    out["encoder_out"] = encoder_out
    out["logits"] = y @ params["decoder.output_projection.weight"].T
    if profile:
        out["encoder_omegas"], out["decoder_omegas"] = enc_profile.omegas, dec_profile.omegas
    return out
