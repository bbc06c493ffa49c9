"""Fusion of a model's ops as it runs: the rules it.compile applies, so that a model written the plain PyTorch way
gets the fused ops infinitrain's own models call by hand.

Inside a compiled forward (infinitrain.compiler), a few ops return *pending* tensors instead of computing at once:
a Tensor that knows its shape, dtype, device and how to compute its value, and computes it the first time
anything reads it (any op, .numpy(), printing). A consumer that recognises a pending input computes the fused op
instead:

- layout: `x.view(B, T, H, D).transpose(1, 2)` is a pending permute; scaled_dot_product_attention of three such
  runs the attention op in the projections' layout (sdpa_bthd), and its output is a pending permute again, which
  the usual `.transpose(1, 2)` turns back into the op's own result: no transposed copies, forward or backward.
  Elementwise arithmetic, chunk/split along the last dim and cat keep a pending permute pending (rotary
  embeddings by rotate-half run in the projections' layout).
- residual add + norm: `x + y` of equal shapes is a pending sum; a LayerNorm or RMSNorm of it runs add_layernorm /
  add_rmsnorm, the sum and the norm in one pass, the residual stream's gradient folded into the norm's backward.
- 16-bit norm outputs: under autocast a norm's output read by a linear layer is written in autocast's dtype by the
  norm itself (the linear would cast it to that anyway; amp.POLICY's `low-output`), unless the norm module keeps
  float32 outputs (`keep_float32_output`: several linears read it, and their input gradients meet in float32).
- linear + tanh GELU + linear: a linear reading a norm's output is pending; a tanh GELU of it is pending too, and a
  linear of that runs linear_gelu_linear (GPT-2's MLP as one node, whose GELU a provider may fuse into the GEMMs).
- SwiGLU: `F.silu(a) * b` is the swiglu op (one pass forward and backward).

The models train under these rules (the Trainer runs their forward with fusion on), so their code is the plain
block: `x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))`.

Values are those of the plain ops: the fused kernels are tested against the ops they replace, and the norm and
attention fusions give the same bits in float32 (swiglu's backward may differ in the last bit). A pending value is
computed from its inputs as they were when it was made; if one of them is written in place before that, the
computation raises instead of using the new contents. Autograd nodes are those the plain ops record, so gradients
are the same too.
"""

import sys

from infinitrain import amp, autograd, dispatch
from infinitrain import functional as F
from infinitrain.tensor import FLOAT_DTYPES, Tensor

_FLOATS = frozenset(FLOAT_DTYPES)
_HALF = frozenset(("bfloat16", "float16"))
_BTHD = (0, 2, 1, 3)  # [B, T, H, D] <-> [B, H, T, D]


class Pending(Tensor):
    """A tensor whose value is computed when first read (its `_t` slot is empty until then)."""

    __slots__ = ("_shape", "_dtype", "_device", "_inputs", "_pending_inputs", "_waiters", "_first")

    def _init(self, shape, dtype, device, requires_grad, inputs):
        self._shape, self._dtype, self._device = tuple(shape), dtype, device
        self._waiters = self._first = None
        self.requires_grad, self.grad, self._node = requires_grad, None, None
        self._hooks = self._post_hooks = None
        self._retains_grad = False
        # (tensor, native, version) of every input the value is computed from: neither written nor rebound (an
        # in-place op with a graph rebinds) before it is computed. A pending input checks its own inputs when read,
        # and its value, once computed (`_first`, fresh at version 0), is held to the same.
        pending = tuple(t for t in inputs if isinstance(t, Pending) and not t.is_materialized())
        held = [t for t in inputs if t is not None and not any(t is q for q in pending)]
        self._inputs = tuple((t, t._t, t._t.version) for t in held)
        self._pending_inputs = pending

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def device(self):
        return self._device

    @property
    def ndim(self):
        return len(self._shape)

    def dim(self):
        return len(self._shape)

    def numel(self):
        n = 1
        for s in self._shape:
            n *= s
        return n

    def size(self, dim=None):
        return self._shape if dim is None else self._shape[dim]

    def is_floating_point(self):
        return self._dtype in _FLOATS

    def is_materialized(self):
        try:
            object.__getattribute__(self, "_t")
        except AttributeError:
            return False
        return True

    def _check_inputs(self):
        held = [(p, p._first, 0) for p in self._pending_inputs if p.is_materialized() and p._first is not None]
        if any(t._t is not native or native.version != v for t, native, v in (*self._inputs, *held)):
            raise RuntimeError(
                "a tensor that a deferred op of it.compile reads was modified in place before the op ran; "
                "clone it before writing to it, or run the model without it.compile"
            )

    def __getattr__(self, name):
        if name != "_t":
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        self._check_inputs()
        self._materialize()
        self._first = object.__getattribute__(self, "_t")
        for fn in self._waiters or ():
            fn(self)
        self._waiters = None
        return object.__getattribute__(self, "_t")

    def when_computed(self, fn):
        """Calls fn(self) once the value is computed (at once if it is); a value a fused op took instead (a
        linear joined to the next one) is never computed, and fn is not called. For observers (the precision
        checker) that must not force a value, and with it the unfused ops."""
        if self.is_materialized():
            fn(self)
        else:
            self._waiters = [*(self._waiters or ()), fn]

    def _materialize(self):
        raise NotImplementedError


def _needs(*ts):
    return dispatch.needs_grad(*ts)


# ---- layout ------------------------------------------------------------------------------------------------------


class PendingPermute(Pending):
    """permute(src, perm), src a tensor with a value (possibly pending too, then read first)."""

    __slots__ = ("src", "perm")

    @classmethod
    def make(cls, src, perm):
        p = cls.__new__(cls)
        p.src, p.perm = src, tuple(perm)
        p._init(tuple(src.shape[d] for d in perm), src.dtype, src.device, _needs(src), (src,))
        return p

    def _materialize(self):
        with autograd.enable_grad() if self.requires_grad else autograd.no_grad():
            out = F.permute_eager(self.src, list(self.perm))
        self._t, self._node = out._t, out._node


def _compose(inner, outer):
    """perm of permute(permute(x, inner), outer) as one permute of x."""
    return tuple(inner[d] for d in outer)


def _identity(perm):
    return all(d == i for i, d in enumerate(perm))


def permute(x, dims):
    dims = tuple(d % len(dims) for d in dims)
    if isinstance(x, PendingPermute) and not x.is_materialized():
        perm = _compose(x.perm, dims)
        return x.src if _identity(perm) else PendingPermute.make(x.src, perm)
    if _identity(dims):
        return None  # the eager op copies; leave it so (callers may expect a new tensor)
    return PendingPermute.make(x, dims)


def _layout(x):
    """(source, perm) of an unread pending permute, else None."""
    if isinstance(x, PendingPermute) and not x.is_materialized():
        return x.src, x.perm
    return None


def sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale):
    """Attention of three pending [B, H, T, D] <- [B, T, H, D] permutes in the projections' layout."""
    lq, lk, lv = _layout(q), _layout(k), _layout(v)
    if attn_mask is not None or dropout_p or lq is None or lk is None or lv is None:
        return None
    if not (lq[1] == lk[1] == lv[1] == _BTHD) or q.ndim != 4:
        return None
    if is_causal and q.shape[2] != k.shape[2]:
        return None
    out = F.attention_bthd(lq[0], lk[0], lv[0], is_causal=bool(is_causal), scale=scale)
    return PendingPermute.make(out, _BTHD)


def _moved_operand(other, perm, ndim):
    """`other` (a tensor broadcasting against a pending permute's value, or a number) in the source's layout: the
    value's dim i is the source's dim perm[i], so other's dims move the same way (a reshape when its dims that are
    not 1 keep their order, else a permuted copy, which broadcast operands are small enough for)."""
    if not isinstance(other, Tensor):
        return other
    lay = _layout(other)
    if lay is not None:
        return lay[0] if lay[1] == perm else None
    if other.ndim > ndim or isinstance(other, Pending):
        return None
    if other.ndim == 0:
        return other
    shape = (1,) * (ndim - other.ndim) + tuple(other.shape)
    inv = [0] * ndim
    for i, d in enumerate(perm):
        inv[d] = i
    dest = [perm[i] for i, s in enumerate(shape) if s != 1]
    if dest == sorted(dest):
        return other.reshape(tuple(shape[inv[j]] for j in range(ndim)))
    return F.permute_eager(other.reshape(shape), inv)


def binary(fn, a, b):
    """fn(a, b) for elementwise fn (add, sub, mul, div) where an operand is a pending permute: computed in the
    source's layout, the result pending in the same permute."""
    la, lb = _layout(a), _layout(b)
    if la is not None:
        src, perm = la
        other = _moved_operand(b, perm, len(perm))
        if other is None:
            return None
        out = fn(src, other)
    elif lb is not None:
        src, perm = lb
        other = _moved_operand(a, perm, len(perm))
        if other is None:
            return None
        out = fn(other, src)
    else:
        return None
    if tuple(out.shape) != tuple(src.shape):
        return None  # broadcasting grew the result: keep it (it is already computed) as a plain tensor
    return PendingPermute.make(out, perm)


def unary(fn, x, *args):
    lay = _layout(x)
    if lay is None:
        return None
    return PendingPermute.make(fn(lay[0], *args), lay[1])


def split(x, split_size, dim):
    lay = _layout(x)
    if lay is None:
        return None
    src, perm = lay
    d = perm[dim % len(perm)]
    return tuple(PendingPermute.make(p, perm) for p in F.split(src, split_size, d))


def cat(tensors, dim):
    lays = [_layout(t) for t in tensors]
    if not lays or any(lay is None for lay in lays) or len({lay[1] for lay in lays}) != 1:
        return None
    perm = lays[0][1]
    return PendingPermute.make(F.cat([lay[0] for lay in lays], perm[dim % len(perm)]), perm)


# ---- SwiGLU ------------------------------------------------------------------------------------------------------


class PendingSilu(Pending):
    """silu(x), computed with the product it meets (silu(gate) * up is the swiglu op) or alone."""

    __slots__ = ("x",)

    @classmethod
    def make(cls, x):
        p = cls.__new__(cls)
        p.x = x
        p._init(x.shape, x.dtype, x.device, _needs(x), (x,))
        return p

    def _materialize(self):
        with autograd.enable_grad() if self.requires_grad else autograd.no_grad():
            out = F.silu_eager(self.x)
        self._t, self._node = out._t, out._node


def silu(x):
    if x.dtype not in _FLOATS or isinstance(x, PendingPermute):
        return None
    return PendingSilu.make(x)


def swiglu_product(a, b):
    """silu(gate) * up as the swiglu op, for a pending silu and a tensor of its shape (either order)."""
    gate, up = (a, b) if isinstance(a, PendingSilu) else (b, a)
    if not isinstance(gate, PendingSilu) or gate.is_materialized() or not isinstance(up, Tensor):
        return None
    if isinstance(up, PendingSilu) or up.shape != gate.shape or up.dtype not in _FLOATS:
        return None
    gate._check_inputs()
    return F.swiglu(gate.x, up)


# ---- residual add + norm -----------------------------------------------------------------------------------------


class PendingAdd(Pending):
    """a + b of equal shapes (floats), recorded as the add's node at once; computed by the next norm's fused op,
    or alone when something else reads it first."""

    __slots__ = ("a", "b")

    @classmethod
    def make(cls, a, b):
        p = cls.__new__(cls)
        p.a, p.b = a, b
        p._init(a.shape, dispatch.result_dtype(a, b), a.device, False, (a, b))
        if _needs(a, b):
            dispatch.record(p, (a, b), lambda g: (g, g), "add")
        return p

    def _materialize(self):
        a, b = self.a, self.b
        if a.dtype != self._dtype:
            a = F.cast_eager(a, self._dtype)
        if b.dtype != self._dtype:
            b = F.cast_eager(b, self._dtype)
        self._t = dispatch.call("add", [a, b])[0]


def add(a, b):
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        return None
    if a.shape != b.shape or a.dtype not in _FLOATS or b.dtype not in _FLOATS or a.device != b.device:
        return None
    if isinstance(a, PendingPermute) or isinstance(b, PendingPermute):
        return None
    return PendingAdd.make(a, b)


class PendingNorm(Pending):
    """layernorm / rmsnorm of x over the last dim; x a pending sum joins it in one fused op."""

    __slots__ = ("x", "params", "eps", "kind", "half", "low_output")

    @classmethod
    def make(cls, kind, x, params, eps, low_output=True):
        p = cls.__new__(cls)
        p.kind, p.x, p.params, p.eps, p.half, p.low_output = kind, x, tuple(params), eps, None, low_output
        p._init(x.shape, x.dtype, x.device, _needs(x, *params), (x, *params))
        return p

    def _fused(self, dtype):
        """The norm of x = a + b through add_layernorm / add_rmsnorm, the sum written into x, the output in dtype
        (None: the sum's); its node folds the sum's other gradients (the residual stream's) into the backward."""
        s = self.x
        st = s.dtype
        a, b = s.a, s.b
        if a.dtype != st:
            a = F.cast_eager(a, st)
        fused_dtype = dtype if dtype is not None and (dtype == st or (st == "float32" and dtype in _HALF)) else st
        if b.dtype not in (st, fused_dtype):
            b = F.cast_eager(b, st)
        params = [p if p.dtype == st else F.cast_eager(p, st) for p in self.params]
        op = "add_layernorm" if self.kind == "layernorm" else "add_rmsnorm"
        s._check_inputs()
        outs = dispatch.call(op, [a, b, *params], [float(self.eps), "" if fused_dtype == st else fused_dtype])
        s._t = s._first = outs[0]
        out, stats = Tensor(outs[1]), [Tensor(t) for t in outs[2:]]
        if _needs(s, *params):
            sd = Tensor(s._t)

            def backward(g, pending):
                ins = [g, sd, params[0], *stats] + ([] if pending is None else [pending])
                return tuple(Tensor(t) for t in dispatch.call(op + "_backward", ins))

            dispatch.record(out, (s, *params), backward, op, (s, params[0]), fold=0)
        if dtype is not None and out.dtype != dtype:
            out = F.cast(out, dtype)
        return out

    def _can_fuse(self):
        return isinstance(self.x, PendingAdd) and not self.x.is_materialized() and len(self.x.shape) >= 1

    def read16(self, dtype):
        """This norm's output in the 16-bit dtype (for linears under autocast), written so by the fused op where x
        is a pending sum, once for every linear that reads it (q, k and v; gate and up); else None."""
        if not self.low_output:
            return None
        if self.half is not None and self.half.dtype == dtype:
            return self.half
        if self._can_fuse() and self._dtype == "float32":
            self.half = self._fused(dtype)
            return self.half
        return None

    def _materialize(self):
        if self._can_fuse():
            out = self._fused(None)
        else:
            eager = F.layer_norm_eager if self.kind == "layernorm" else F.rms_norm_eager
            with autograd.enable_grad() if self.requires_grad else autograd.no_grad():
                out = eager(self.x, *self.params, self.eps)
        self._t, self._node = out._t, out._node
        self.requires_grad = out.requires_grad


def norm(kind, x, params, eps, low_output=True):
    if x.dtype not in _FLOATS or isinstance(x, PendingPermute):
        return None
    return PendingNorm.make(kind, x, params, eps, low_output)


def linear_input(x):
    """x as a linear under autocast reads it: a pending norm's output written in the 16-bit dtype by the norm."""
    if isinstance(x, PendingNorm) and not x.is_materialized():
        dtype = amp.autocast_dtype()
        if dtype is not None and amp.lowers("linear"):
            out = x.read16(dtype)
            if out is not None:
                return out
    return x


# ---- linear + tanh GELU + linear ---------------------------------------------------------------------------------


class PendingLinear(Pending):
    """linear(x, weight, bias) of a pending norm's output x, computed when read (as the autocast state was when it
    was made), or joined with a tanh GELU and the next linear into linear_gelu_linear."""

    __slots__ = ("x", "weight", "bias", "cast", "grad_on")

    @classmethod
    def make(cls, x, weight, bias):
        p = cls.__new__(cls)
        p.x, p.weight, p.bias, p.cast, p.grad_on = x, weight, bias, amp.autocast_dtype(), autograd.is_grad_enabled()
        out_dtype = p.cast if p.cast is not None and amp.lowers("linear") else dispatch.result_dtype(x, weight)
        if out_dtype not in _FLOATS:
            out_dtype = x.dtype
        shape = (*x.shape[:-1], weight.shape[0])
        p._init(shape, out_dtype, x.device, _needs(x, weight, bias), (x, weight, bias))
        return p

    def _materialize(self):
        if amp.autocast_dtype() == self.cast and autograd.is_grad_enabled() == self.grad_on:
            out = F.linear_eager(self.x, self.weight, self.bias)  # read where it was made (the usual case)
        else:
            with amp.autocast(dtype=self.cast, enabled=self.cast is not None):
                with autograd.enable_grad() if self.grad_on else autograd.no_grad():
                    out = F.linear_eager(self.x, self.weight, self.bias)
        self._t, self._node = out._t, out._node


class PendingGelu(Pending):
    """gelu(linear, approximate="tanh") of a pending linear: linear_gelu_linear when a linear reads it."""

    __slots__ = ("lin",)

    @classmethod
    def make(cls, lin):
        p = cls.__new__(cls)
        p.lin = lin
        p._init(lin.shape, lin.dtype, lin.device, lin.requires_grad, ())
        return p

    def _materialize(self):
        with autograd.enable_grad() if self.requires_grad else autograd.no_grad():
            out = F.gelu_eager(self.lin, "tanh")
        self._t, self._node = out._t, out._node


def linear(x, weight, bias):
    """A linear of a pending tanh GELU of a pending linear is linear_gelu_linear; a linear reading a pending norm's
    output waits (a tanh GELU and a linear may follow it)."""
    if isinstance(x, PendingGelu):
        return linear_of_gelu(x, weight, bias)
    if not isinstance(x, PendingNorm) or x.is_materialized() or weight.ndim != 2:
        return None
    if x.ndim < 1 or x.shape[-1] != weight.shape[1] or (bias is not None and bias.ndim != 1):
        return None
    return PendingLinear.make(x, weight, bias)


def gelu_tanh(x):
    if isinstance(x, PendingLinear) and not x.is_materialized():
        return PendingGelu.make(x)
    return None


def linear_of_gelu(x, weight, bias):
    """linear(gelu(linear(h, w1, b1), "tanh"), weight, bias) as linear_gelu_linear, for an unread pending GELU made
    under the same autocast and grad states. Should the first linear's output be read afterwards, it is computed
    then as well (correct values and gradients, one GEMM more); models do not read it."""
    if not isinstance(x, PendingGelu) or x.is_materialized() or x.lin.is_materialized():
        return None
    lin = x.lin
    if amp.autocast_dtype() != lin.cast or autograd.is_grad_enabled() != lin.grad_on:
        return None  # the two linears run under other autocast or grad states: as the eager ops
    lin._check_inputs()
    return F.linear_gelu_linear(linear_input(lin.x), lin.weight, lin.bias, weight, bias)


def settle(x):
    """x's value: a pending tensor computed now (as a plain op would have), anything else as it is. A module that
    reads its input more than once in different ways (LoRA's base and adapter) takes it settled."""
    if isinstance(x, Pending) and not x.is_materialized():
        x._t  # noqa: B018 (reading computes it)
    return x


F.set_fusion_rules(sys.modules[__name__])
