"""Activation modules beyond modules.py's, and multi-head attention (PyTorch keeps it with the activations)."""

import math

import numpy as np

from infinitrain import functional as F
from infinitrain.nn import functional as nnF
from infinitrain.nn import init
from infinitrain.nn.modules import Linear, Module, Parameter
from infinitrain.tensor import empty, from_numpy, zeros


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return nnF.leaky_relu(x, self.negative_slope)


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return nnF.elu(x, self.alpha)


class Softplus(Module):
    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return nnF.softplus(x, self.beta, self.threshold)


class Mish(Module):
    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, x):
        return nnF.mish(x)


class GLU(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return nnF.glu(x, self.dim)


class Hardtanh(Module):
    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x):
        return nnF.hardtanh(x, self.min_val, self.max_val)


class LogSigmoid(Module):
    def forward(self, x):
        return nnF.logsigmoid(x)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: softmax(q k^T / sqrt(d)) v over num_heads heads of the projected inputs, then
    the output projection. Inputs are [L, N, E] ([N, L, E] with batch_first) or unbatched [L, E]; attn_mask (bool:
    True masks a position out, as PyTorch's; or float, added) is [L, S] or [N * num_heads, L, S]; key_padding_mask
    (bool: True ignores that key) is [N, S]. Without masks, dropout and need_weights the heads run through the
    fused attention op."""

    def __init__(
        self,
        embed_dim,
        num_heads,
        dropout=0.0,
        bias=True,
        add_bias_kv=False,
        add_zero_attn=False,
        kdim=None,
        vdim=None,
        batch_first=False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        device, dtype = device or "cpu", dtype or "float32"
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(empty(3 * embed_dim, embed_dim, dtype=dtype, device=device))
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
            init.xavier_uniform_(self.in_proj_weight)
        else:
            self.in_proj_weight = None
            self.q_proj_weight = Parameter(empty(embed_dim, embed_dim, dtype=dtype, device=device))
            self.k_proj_weight = Parameter(empty(embed_dim, self.kdim, dtype=dtype, device=device))
            self.v_proj_weight = Parameter(empty(embed_dim, self.vdim, dtype=dtype, device=device))
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        self.in_proj_bias = Parameter(zeros(3 * embed_dim, dtype=dtype, device=device)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        init.kaiming_uniform_(self.out_proj.weight, a=math.sqrt(5))
        if bias:
            init.zeros_(self.out_proj.bias)

    def _project(self, query, key, value):
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else F.split(b, e, 0)
        if self._qkv_same_embed_dim:
            wq, wk, wv = F.split(self.in_proj_weight, e, 0)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights=True,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ):
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
        elif self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        L, N, E = query.shape
        S = key.shape[0]
        H, D = self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)
        # [L, N, E] -> [N, H, L, D]
        q, k, v = (F.permute(t.reshape(t.shape[0], N, H, D), [1, 2, 0, 3]) for t in (q, k, v))
        mask = None  # additive float mask [N, H or 1, L, S]
        if attn_mask is not None:
            am = attn_mask
            if am.dtype == "bool":
                am = F.masked_fill(zeros(am.shape, dtype=q.dtype, device=q.device), am, -math.inf)
            am = am.reshape(1, 1, L, S) if am.ndim == 2 else am.reshape(N, H, L, S)
            mask = am if am.dtype == q.dtype else F.cast(am, q.dtype)
        if key_padding_mask is not None:
            kp = key_padding_mask.reshape(N, S) if not unbatched else key_padding_mask.reshape(1, S)
            if kp.dtype == "bool":
                kp = F.masked_fill(zeros(kp.shape, dtype=q.dtype, device=q.device), kp, -math.inf)
            kp = kp.reshape(N, 1, 1, S)
            kp = kp if kp.dtype == q.dtype else F.cast(kp, q.dtype)
            mask = kp if mask is None else F.add(mask, kp)
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = F.affine(F.matmul(q, k, False, True), 1.0 / math.sqrt(D), 0.0)
            if is_causal and mask is None:
                above = from_numpy(np.triu(np.ones((L, S), dtype=bool), 1), device=q.device)
                scores = F.masked_fill(scores, above, -math.inf)
            if mask is not None:
                scores = F.add(scores, mask)
            attn = F.softmax(scores, -1)
            weights = attn
            if p > 0.0:
                attn = F.dropout(attn, p, True)
            out = F.matmul(attn if attn.dtype == v.dtype else F.cast(attn, v.dtype), v)
            weights = F.mean(weights, 1) if average_attn_weights else weights
        else:
            causal = is_causal and mask is None
            out = F.scaled_dot_product_attention(q, k, v, mask, p, causal)
        out = F.permute(out, [2, 0, 1, 3]).reshape(L, N, E)  # [N, H, L, D] -> [L, N, E]
        out = self.out_proj(out)
        if unbatched:
            out = out.squeeze(1)
            weights = weights.squeeze(0) if weights is not None else None
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, weights
