"""Residual multi-head attention: residual scores (RealFormer, He et al. 2021) and residual values
(ResFormer, Zhou et al. 2025), each on its own choice of paths.

Every attention layer on a residual score path adds the previous layer's raw pre-softmax scores
to its own and hands the sum on:

    S_n = Q_n K_nᵀ / √d_k + S_{n-1}                      (S_0 = 0)
    P_n = softmax(S_n + mask)              running sum   (``mode sum``)
    P_n = softmax(S_n / n + mask)          running mean  (``mode mean``; n = layers traversed)

What is carried is the *unmasked, undivided* sum S_n, as in the paper's official code: masks
(key padding, the decoder's future mask, ``attn_mask``) and the running-mean temperature touch
only this layer's own softmax input, never the tensor handed on. Carrying finite, unmasked
scores keeps ``-inf`` out of the running sum, so no ``inf - inf`` or ``0 * -inf`` NaN can arise,
and masked entries are masked again by every layer that reads them.

Decoding needs no extra cache: row t of S_n depends only on row t of S_{n-1}, so each decoding
step carries ``(B·H, 1, t)`` self-attention scores and ``(B·H, 1, S)`` cross-attention scores
from layer to layer.

On a value-residual path, attention layer n ≥ 2 reads the values

    V_n' = λ·V_n + (1 − λ)·V_1         V_1: the path's first layer's projected values (bias included)

with λ = ½ (``half``, ResFormer) or λ = sigmoid(x·w + b) per token and head (``learned``; x the
sublayer's query input, w and b zero at initialisation, so it starts as ``half``). In
self-attention a token's λ mixes its own values (query and value tokens are the same tokens, as
in x-transformers); in cross-attention the values are the encoder's, so query t's λ mixes what t
reads: λ_t·(P V_n)_t + (1 − λ_t)·(P V_1)_t. Decoding needs no extra cache either: a
self-attention layer caches its mixed values and needs only the step's rows of V_1;
cross-attention reads V_1 from the first layer's cache. Under LayerDrop, V_1 is the values of
the first layer of the path that runs in this pass. V_1 is carried in float32 when the attention
computes in half precision (float16 or bfloat16, also under ``--bf16``'s autocast), as the scores
are.

A layer calls one of two modules per attention sublayer, the same way:
``ResidualMultiheadAttention`` where its path carries scores or values, ``PlainMultiheadAttention``
(fairseq's own) where it carries nothing. Both take what the path carried (``Carried``) and answer
``Attended``.
"""

from typing import Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from ..errors import RealformerConfigError

# Attention computing in these dtypes carries S_n and V_1 in float32: a deep running sum can overflow
# float16's 65504, and bfloat16's 8-bit mantissa doubles the error of S_18 against float32
# (tests/test_bf16.py).
HALF = (torch.float16, torch.bfloat16)


class _SoftmaxSavedInHalf(torch.autograd.Function):
    """softmax computed in float32 and returned in the attention's (half) dtype, saving only
    that half copy for backward (it needs nothing but the output). Plain ``softmax(float32)``
    followed by a cast keeps the float32 output for softmax's backward and the half copy for the
    value product's: 6 bytes per attention weight instead of 2, the largest activation of long
    sentences."""

    @staticmethod
    def forward(ctx, logits: Tensor, dtype: torch.dtype) -> Tensor:
        probs = F.softmax(logits, dim=-1, dtype=torch.float32).to(dtype)
        ctx.save_for_backward(probs)
        ctx.logits_dtype = logits.dtype
        return probs

    @staticmethod
    def backward(ctx, grad: Tensor):
        (probs,) = ctx.saved_tensors
        # softmax's own backward kernel, in float32: P·(g − Σ g·P) in one kernel instead of four
        grad_logits = torch._softmax_backward_data(grad.float(), probs.float(), -1, torch.float32)
        return grad_logits.to(ctx.logits_dtype), None


def _softmax(logits: Tensor, dtype: torch.dtype) -> Tensor:
    """Attention probabilities in *dtype*, computed in float32 (in float64 for float64)."""
    if dtype not in HALF:
        return F.softmax(logits.to(dtype), dim=-1)
    if not torch.is_grad_enabled():  # decoding: nothing is saved, no autograd Function to call
        return F.softmax(logits, dim=-1, dtype=torch.float32).to(dtype)
    return _SoftmaxSavedInHalf.apply(logits, dtype)


class Carried(NamedTuple):
    """What one attention layer hands to the next on its path (None: nothing carried)."""

    scores: Optional[Tensor] = None  # S_n: the unmasked, undivided running sum of scores
    values: Optional[Tensor] = None  # V_1: the path's first layer's values (value residual)


class Attended(NamedTuple):
    """What every attention module a plugin layer calls answers: ``ResidualMultiheadAttention``
    on a residual path, ``PlainMultiheadAttention`` (fairseq's own) off it."""

    output: Tensor  # (tgt_len, bsz, embed_dim)
    # this layer's attention probabilities when asked for (need_weights: averaged over heads;
    # need_head_weights: (heads, bsz, tgt_len, src_len)), else None: fairseq's second return value
    weights: Optional[Tensor]
    carried: Carried  # what this layer hands the next on its path: Carried() off the path


def _per_sentence_bmm(a: Tensor, b: Tensor, kv_bsz: int, num_heads: int) -> Tensor:
    """``bmm`` for beamable cross-attention, where the encoder side is kept once per sentence,
    not once per hypothesis: *a* (sentences · beam · heads, rows, k) from the hypotheses, *b*
    (sentences · heads, k, cols) from the encoder; every hypothesis uses its sentence's *b*."""
    rows, cols = a.size(1), b.size(2)
    # einsum folds the beam into the rows of one bmm per (sentence, head): b is never copied
    a = a.view(kv_bsz, -1, num_heads, rows, a.size(2))
    b = b.view(kv_bsz, num_heads, b.size(1), cols)
    return torch.einsum("bxhtk,bhkn->bxhtn", a, b).reshape(-1, rows, cols)


class PlainMultiheadAttention(MultiheadAttention):
    """fairseq's ``MultiheadAttention``, computing exactly what it computes (its fused SDPA path
    included), for a sublayer whose path carries nothing. Subclassed to answer as
    ``ResidualMultiheadAttention`` does, so that a layer calls either the same way, and to give
    training self-attention's three projections to that SDPA path as one packed GEMM; the
    parameters, their names and their initialisation are fairseq's."""

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        *,
        carried: Carried = Carried(),
        depth: int = 1,
        **kwargs,
    ) -> Attended:
        """fairseq's ``forward`` (keyword arguments as its), answering ``Attended``. *carried*
        (empty on a path that carries nothing) and *depth* are taken, as the residual module
        takes them, and not used."""
        if self._packs_projections(query, key, value, kwargs):
            output, weights = self._packed_self_attention(query, **kwargs)
        else:
            output, weights = super().forward(query, key, value, **kwargs)
        return Attended(output, weights, Carried())

    def _packs_projections(self, query: Tensor, key, value, kwargs) -> bool:
        """Training self-attention under an autocast where fairseq calls
        ``F.multi_head_attention_forward`` (its conditions), with the three projections' weights as
        torch's packed in-projection: one GEMM instead of three, as
        ``ResidualMultiheadAttention._project_together``, where ``_joins_projections`` allows."""
        return (
            _joins_projections(self)
            and query is key is value
            and kwargs.get("incremental_state") is None
            and not kwargs.get("static_kv", False)
            and not (self.onnx_trace or self.skip_embed_dim_check or self.use_xformers)
            and query.device.type != "xla"
            and not torch.jit.is_scripting()
        )

    def _packed_self_attention(
        self,
        query: Tensor,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        need_head_weights=False,
        **_,
    ):
        """fairseq's call of ``F.multi_head_attention_forward``, argument for argument, with
        ``in_proj_weight`` packed instead of three ``*_proj_weight``."""
        return F.multi_head_attention_forward(
            query,
            query,
            query,
            self.embed_dim,
            self.num_heads,
            torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)),
            torch.cat((self.q_proj.bias, self.k_proj.bias, self.v_proj.bias)),
            self.bias_k,
            self.bias_v,
            self.add_zero_attn,
            self.dropout_module.p,
            self.out_proj.weight,
            self.out_proj.bias,
            self.training or self.dropout_module.apply_during_inference,
            key_padding_mask.bool() if key_padding_mask is not None else None,
            need_weights or need_head_weights,
            attn_mask,
        )


class ResidualMultiheadAttention(MultiheadAttention):
    """fairseq's ``MultiheadAttention`` that takes and returns what its path carries.

    Subclassed for its projections (same parameter names, so state dicts are interchangeable),
    initialisation, incremental-state buffers, beam reordering and beamable cross-attention;
    ``forward`` is replaced because fairseq's never exposes raw scores (its fused SDPA path
    computes none, and ``before_softmax`` returns them already masked, in place).

    Args:
        residual_scores: carry the scores (RealFormer); else this layer's scores stay its own.
        running_mean: softmax over ``S_n / n`` instead of ``S_n`` (the paper's choice for NMT).
        value_mix: "half" or "learned" on a value-residual path, else None.
        value_gate: build λ's w and b (``learned``, layers n ≥ 2).
        Other arguments as for fairseq's ``MultiheadAttention``.
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        *,
        residual_scores: bool = True,
        running_mean: bool = False,
        value_mix: Optional[str] = None,
        value_gate: bool = False,
        **kwargs,
    ):
        for unsupported in ("add_bias_kv", "add_zero_attn", "xformers_att_config"):
            if kwargs.get(unsupported):
                raise RealformerConfigError(f"residual attention does not support {unsupported.replace('_', '-')}")
        super().__init__(embed_dim, num_heads, **kwargs)
        self.residual_scores = residual_scores
        self.running_mean = running_mean and residual_scores
        self.value_mix = value_mix
        # λ = sigmoid(x·w + b) per head; zeros (no random draw), so λ starts at ½
        self.value_gate = ValueGate(embed_dim, num_heads) if value_gate else None

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = False,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        need_head_weights: bool = False,
        carried: Carried = Carried(),
        depth: int = 1,
    ) -> Attended:
        """Time x Batch x Channel in, as fairseq's attention.

        Args:
            carried: what the previous layer on this path handed on: ``S_{n-1}``
                ``(bsz * heads, tgt_len, src_len)`` and ``V_1`` ``(bsz * heads, len, head_dim)``;
                empty for the first layer.
            depth: n, the number of attention layers this path has traversed including this
                one (the running-mean divisor).

        Returns:
            ``Attended``: the output, this layer's probabilities when asked for, and what to
            hand on: ``S_n``, unmasked, and ``V_1``, both in float32 when the attention computes
            in float16 or bfloat16 (a deep running sum can overflow float16's 65504; bfloat16
            rounds it to 8 bits).
        """
        tgt_len, bsz, embed_dim = query.size()
        saved_state = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if static_kv and "prev_key" in saved_state:
                key = value = None  # encoder keys/values were projected at the first step
        q, k, v, key_padding_mask = self._project(query, key, value, key_padding_mask)
        kv_bsz = bsz if k is None else k.size(0) // self.num_heads
        v, first_values = self._value_residual_before_cache(query, v, carried.values)
        if saved_state is not None:
            k, v, key_padding_mask, kv_bsz = self._extend_cache(
                incremental_state, saved_state, k, v, key_padding_mask, static_kv
            )
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        v, first_values, mix_after = self._value_residual_after_cache(query, v, first_values)

        prev_scores = carried.scores if self.residual_scores else None
        need_probs = need_weights or need_head_weights
        attn, probs, scores = self._attend(q, k, v, prev_scores, depth, attn_mask, key_padding_mask, kv_bsz)
        attn = self._value_residual_after_attention(attn, mix_after)

        attn = self.out_proj(_merge_heads(attn, tgt_len, bsz, embed_dim))
        weights = _weights(probs, bsz, self.num_heads, need_head_weights) if need_probs else None
        return Attended(attn, weights, Carried(scores if self.residual_scores else None, first_values))

    # --- value residual: before the cache (self-attention), after it (cross-attention) ------------

    def _value_residual_before_cache(self, query: Tensor, v: Tensor, first_values: Optional[Tensor]):
        """Self-attention mixes this call's values before the cache stores them: the cache keeps
        mixed values, and a decoding step needs only its own rows of V_1. Elsewhere the values
        pass unchanged. Returns (values, V_1 to hand on)."""
        if self.value_mix is None or not self.self_attention:
            return v, first_values
        return self._mix_values(query, v, first_values)

    def _value_residual_after_cache(self, query: Tensor, v: Tensor, first_values: Optional[Tensor]):
        """Cross-attention mixes the encoder's values after the cache (which holds them unmixed,
        projected once) at every step. Elsewhere the values pass unchanged. Returns (values to
        attend over, V_1 to hand on, λ for ``_value_residual_after_attention`` or None)."""
        if self.value_mix is None or self.self_attention:
            return v, first_values, None
        return self._mix_cross_values(query, v, first_values)

    def _value_residual_after_attention(self, attn: Tensor, mix: Optional[Tensor]) -> Tensor:
        """With a λ per query token in cross-attention (*mix*), the values attended over were
        [V_n | V_1] side by side: λ_t·(P V_n)_t + (1 − λ_t)·(P V_1)_t from that one product.
        Without (*mix* None), *attn* as it is."""
        if mix is None:
            return attn
        mix = mix.view(*attn.shape[:-1], 1)  # (batch * heads, rows, 1)
        return torch.lerp(attn[..., self.head_dim :], attn[..., : self.head_dim], mix)

    def _mix_values(self, query: Tensor, v: Tensor, first_values: Optional[Tensor]):
        """Self-attention: V' = λ·V + (1 − λ)·V_1 per token and head (the first layer on the path,
        *first_values* None, keeps V and hands it on as V_1). Returns (V', V_1)."""
        if first_values is None:
            return v, _carried_dtype(v)
        mix = self._mix(query, first_values.dtype)
        return torch.lerp(first_values, v.to(first_values.dtype), mix).to(v.dtype), first_values

    def _mix_cross_values(self, query: Tensor, v: Tensor, first_values: Optional[Tensor]):
        """Cross-attention: the values to attend over and V_1 to hand on; with a λ per query
        token (``learned``), [V_n | V_1] side by side and λ to mix the two weighted sums."""
        if first_values is None:
            return v, _carried_dtype(v), None
        if self.value_gate is None:  # one λ for every token: mix the values themselves
            return self._mix_values(query, v, first_values) + (None,)
        return torch.cat([v, first_values.to(v.dtype)], dim=-1), first_values, self._mix(query, v.dtype)

    def _mix(self, query: Tensor, dtype: torch.dtype):
        """λ: ½, or sigmoid(x·w + b) per token and head as ``(bsz * heads, tokens, 1)`` in *dtype*."""
        if self.value_gate is None:
            return 0.5
        return self.value_gate(query).permute(1, 2, 0).reshape(-1, query.size(0), 1).to(dtype)

    # --- the score chain -----------------------------------------------------------------------

    def _attend(self, q, k, v, prev_scores, depth, attn_mask, key_padding_mask, kv_bsz):
        """The RealFormer score chain, top to bottom. q, k, v: ``(batch * heads, length, head_dim)``.
        Returns (the weighted sum of the values, this layer's probabilities, ``S_n`` to hand on)."""
        scores = self._scores(q, k, prev_scores, kv_bsz)  # S_n = QKᵀ/√d + S_{n-1}
        if scores.dtype in HALF:
            scores = scores.float()  # carried in float32 (HALF)
        divisor = self._divisor(depth)
        logits = scores / divisor if divisor > 1 else scores  # running mean: S_n / n
        logits = self._mask(logits, logits is not scores, attn_mask, key_padding_mask, kv_bsz)
        probs = _softmax(logits, v.dtype)
        return self._weighted_sum(probs, v, kv_bsz), probs, scores

    def _divisor(self, depth: int) -> int:
        """n under the running mean (softmax over S_n / n), else 1."""
        return depth if self.running_mean and depth > 1 else 1

    def _scores(self, q: Tensor, k: Tensor, prev_scores: Optional[Tensor], kv_bsz: int) -> Tensor:
        """S_n = Q Kᵀ/√d + S_{n-1} (*prev_scores*: None on the path's first layer, or a layer that
        does not carry scores). The GEMM applies the 1/√d (its ``alpha``), where fairseq scales
        the queries first: one kernel less per layer and per decoding step."""
        k_t = k.transpose(1, 2)
        if q.size(0) != k_t.size(0):  # beamable cross-attention
            product = _per_sentence_bmm(q, k_t, kv_bsz, self.num_heads)
            if prev_scores is None:
                return product * self.scaling
            return torch.add(prev_scores, product, alpha=self.scaling)
        if prev_scores is None:
            return torch.baddbmm(q.new_empty(()), q, k_t, beta=0, alpha=self.scaling)  # beta 0: no input read
        if prev_scores.dtype == q.dtype:
            return torch.baddbmm(prev_scores, q, k_t, alpha=self.scaling)  # adds the carried scores inside the GEMM
        return torch.add(prev_scores, torch.bmm(q, k_t), alpha=self.scaling)  # a float32 carry promotes a half product

    def _weighted_sum(self, probs: Tensor, v: Tensor, kv_bsz: int) -> Tensor:
        """(dropout(P) V) per (batch, head)."""
        return self._per_head_bmm(self.dropout_module(probs), v, kv_bsz)

    def _per_head_bmm(self, a: Tensor, b: Tensor, kv_bsz: int) -> Tensor:
        """``a @ b`` per (batch, head); in beamable cross-attention *b* (the encoder side) is kept
        once per sentence, not once per hypothesis."""
        if a.size(0) != b.size(0):
            return _per_sentence_bmm(a, b, kv_bsz, self.num_heads)
        return torch.bmm(a, b)

    def _mask(self, logits: Tensor, fresh: bool, attn_mask, key_padding_mask, kv_bsz: int) -> Tensor:
        """This layer's masks on its own softmax input, never on the scores handed on: out of
        place while *logits* may be those scores, in place once a *fresh* tensor exists."""
        if attn_mask is not None:
            logits = logits.add_(attn_mask) if fresh else logits + attn_mask
            fresh = True
        if key_padding_mask is not None:
            rows, src_len = logits.shape[1:]
            padding = key_padding_mask.to(torch.bool).view(kv_bsz, 1, 1, 1, src_len)
            logits5d = logits.view(kv_bsz, -1, self.num_heads, rows, src_len)
            fill = logits5d.masked_fill_ if fresh else logits5d.masked_fill
            logits = fill(padding, float("-inf")).view(-1, rows, src_len)
        return logits

    def _project(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor], key_padding_mask):
        """Queries, keys and values of this call as ``(batch * heads, length, head_dim)`` (keys
        and values None when the cache holds them), and the key padding mask, both kept once
        per sentence in beamable cross-attention."""
        if self._projects_together():  # training: one GEMM per input, see there
            if self.self_attention:
                q, k, v = self._project_together(query, (self.q_proj, self.k_proj, self.v_proj))
                return q, k, v, key_padding_mask
            if self.encoder_decoder_attention and key is not None:
                k, v = self._project_together(key, (self.k_proj, self.v_proj))
                return self._split_heads(self.q_proj(query)), k, v, key_padding_mask
        q = self.q_proj(query)
        if self.self_attention:
            k, v = self.k_proj(query), self.v_proj(query)
        elif key is None:
            k = v = None
        else:
            if self.encoder_decoder_attention and self.beam_size > 1 and key.size(1) == query.size(1):
                # beamable cross-attention: keep one copy of the encoder states per sentence
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(-1, self.beam_size, key_padding_mask.size(1))[:, 0, :]
            k = self.k_proj(key)
            # fairseq's cross-attention projects values from the key input too
            v = self.v_proj(key if self.encoder_decoder_attention else value)
        q, k, v = (None if t is None else self._split_heads(t) for t in (q, k, v))
        return q, k, v, key_padding_mask

    def _split_heads(self, t: Tensor) -> Tensor:
        """(length, batch, embed_dim) → (batch * heads, length, head_dim), a view."""
        return t.view(t.size(0), -1, self.head_dim).transpose(0, 1)

    def _projects_together(self) -> bool:
        """Where ``_joins_projections`` allows, the projections that read the same input run as one
        GEMM (``_project_together``): q, k and v in self-attention, k and v in cross-attention."""
        return _joins_projections(self) and self.k_proj.in_features == self.v_proj.in_features

    def _project_together(self, x: Tensor, projections):
        """*projections* of the one input *x*, split into heads as ``_project`` gives them, from one
        ``F.linear`` with their weights side by side (the parameters stay separate, under their
        names). Under an autocast fairseq's way costs a cast of the input, the weight and the
        bias per projection, and in backward a GEMM pair and a bias sum per projection and an
        add where the input's gradients meet; here one of each. The values are the separate
        projections' (one GEMM computes each output as they do)."""
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        out = F.linear(x, weight, bias)
        # one copy to (projection, length, batch, embed_dim), as torch's packed in-projection does:
        # then every projection's heads are a view
        out = out.view(*out.shape[:-1], len(projections), self.embed_dim)
        packed = out.movedim(-2, 0).contiguous().unbind(0)
        return [self._split_heads(t) for t in packed]

    def _extend_cache(self, incremental_state, saved_state, k, v, key_padding_mask, static_kv):
        """Prepend cached keys/values (decoder self-attention) or reuse them (cross-attention),
        and store the result, as fairseq's ``MultiheadAttention`` does."""
        kv_bsz = k.size(0) // self.num_heads if k is not None else None
        if "prev_key" in saved_state:
            prev_key = saved_state["prev_key"]
            kv_bsz = prev_key.size(0)
            prev_key = prev_key.view(kv_bsz * self.num_heads, -1, self.head_dim)
            prev_value = saved_state["prev_value"].view(kv_bsz * self.num_heads, -1, self.head_dim)
            if static_kv:
                k, v = prev_key, prev_value
            else:
                k, v = torch.cat([prev_key, k], dim=1), torch.cat([prev_value, v], dim=1)
        else:
            k, v = _cacheable(k), _cacheable(v)
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
            batch_size=kv_bsz,
            src_len=k.size(1),
            static_kv=static_kv,
        )
        saved_state["prev_key"] = k.view(kv_bsz, self.num_heads, -1, self.head_dim)
        saved_state["prev_value"] = v.view(kv_bsz, self.num_heads, -1, self.head_dim)
        saved_state["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved_state)
        return k, v, key_padding_mask, kv_bsz


class ValueGate(nn.Module):
    """λ = sigmoid(x·w + b), one per head, for every token of x (``learned`` value residual)."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_heads, embed_dim))
        self.bias = nn.Parameter(torch.zeros(num_heads))

    def forward(self, x: Tensor) -> Tensor:
        """(tokens, bsz, embed_dim) → (tokens, bsz, heads)."""
        return torch.sigmoid(F.linear(x, self.weight, self.bias))


def _merge_heads(attn: Tensor, tgt_len: int, bsz: int, embed_dim: int) -> Tensor:
    """The heads' outputs side by side, ``(tgt_len, bsz, embed_dim)``, from ``(bsz * heads,
    tgt_len, head_dim)``."""
    return attn.transpose(0, 1).reshape(tgt_len, bsz, embed_dim)


def _joins_projections(attention: MultiheadAttention) -> bool:
    """*attention*'s q, k and v projections run as one GEMM over their concatenated weights (both
    modules' packed paths): in training under an autocast (``--bf16``), where it saves a cast of the
    input per projection. In float32 it saves none, and the host's time to concatenate the weights
    and lay out the result exceeds what the fewer operations save (benchmarks/RESULTS.md, "bf16
    mixed precision on a CPU"). Not in decoding, where concatenating the weights at every step
    would cost more than it saves. Each projection needs a bias (fairseq's default; its packed
    SDPA path concatenates them), and no hook may alter its weight in its own forward (fairseq's
    quant noise)."""
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    return (
        attention.training
        and torch.is_grad_enabled()
        and torch.is_autocast_enabled(attention.q_proj.weight.device.type)
        and all(p.bias is not None and not (p._forward_pre_hooks or p._forward_hooks) for p in projections)
    )


def _cacheable(t: Tensor) -> Tensor:
    """Keys or values as a new cache keeps them: contiguous. The encoder's, projected once, are
    otherwise a transposed view (``_split_heads``) that stays in the cache for the whole search
    (fairseq does not reorder them: a sentence's hypotheses read the same), and a bfloat16 ``bmm``
    on a CPU copies such an operand at every step: 7 % of a beam-5 decode at d=128
    (benchmarks/RESULTS.md, bf16 on a CPU). The decoder's own keys are contiguous already."""
    return t.contiguous()


def _carried_dtype(t: Tensor) -> Tensor:
    """What is carried from layer to layer: float32 when the attention computes in half precision."""
    return t.float() if t.dtype in HALF else t


def _weights(probs: Tensor, bsz: int, num_heads: int, per_head: bool) -> Tensor:
    """Attention probabilities in float32, ``(heads, bsz, tgt, src)`` per head, else averaged
    over heads as fairseq returns them."""
    weights = probs.float().view(bsz, num_heads, *probs.shape[1:]).transpose(1, 0)
    return weights if per_head else weights.mean(dim=0)
