"""FP8 training of linear layers: the GEMMs in 8-bit floats, everything else as it was.

    model = fp8.convert(model)                       # its nn.Linear layers become Fp8Linear (head left alone)
    with it.autocast("cuda", dtype=it.bfloat16):
        loss = model(x) ...                          # forward GEMMs e4m3 x e4m3, backward e5m2 gradients

The recipe is the hybrid one: activations and weights in float8_e4m3fn (more precision), output gradients in
float8_e5m2 (more range); every GEMM accumulates in float32 and writes the layer's output dtype (autocast's, else
the input's). Each tensor is scaled into the format's range before the cast, per tensor:

- delayed (default): the scale comes from the largest |value| seen over the last `amax_history_len` uses
  (fmax / amax / 2^margin), updated after each use; no extra pass over the data, and the history and scales are
  module buffers, so checkpoints carry them and a resumed run continues with the same scales.
- current: the scale comes from this tensor's own amax, one more pass over it; nothing to carry.

Values past the format's range saturate (never inf or NaN from scaling). The master weights, the optimizer
state, the bias and everything outside the linears are unchanged; the weight is quantized from its master copy
each forward, and the backward reuses the forward's float8 input and weight (which is also what it saves: a byte
per element instead of two).

A provider runs FP8 when it has native kernels for fp8_matmul and fp8_quantize (`supported`); the composites let
every provider run the ops in the conformance suites, but training on them would be slower than bfloat16, so
`convert` refuses such a device.
"""

import dataclasses

from infinitrain import amp, autograd, dispatch, fusion, nn
from infinitrain import functional as F
from infinitrain import tensor_ops as T
from infinitrain.tensor import Tensor, tensor

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
FMAX = {E4M3: 448.0, E5M2: 57344.0}
SCALINGS = ("delayed", "current")
# Rows of an Fp8Linear's amax history and scale buffers.
INPUT, WEIGHT, GRAD = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How FP8 layers scale their tensors (see the module's doc)."""

    scaling: str = "delayed"
    amax_history_len: int = 16
    margin: int = 0  # scales are divided by 2^margin: headroom for values that grow between updates

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise ValueError(f"fp8 scaling must be one of {', '.join(SCALINGS)}, got {self.scaling!r}")
        if isinstance(self.amax_history_len, bool) or not isinstance(self.amax_history_len, int):
            raise TypeError(f"amax_history_len must be an int, got {self.amax_history_len!r}")
        if not 1 <= self.amax_history_len <= 4096:
            raise ValueError(f"amax_history_len must be in [1, 4096], got {self.amax_history_len}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, int) or not 0 <= self.margin <= 16:
            raise ValueError(f"margin must be an int in [0, 16], got {self.margin!r}")


def supported(device):
    """(ok, reason): whether `device`'s provider has native FP8 kernels (reason says what is missing)."""
    device = str(device)
    missing = [op for op in ("fp8_quantize", "fp8_matmul") if dispatch.how(op, device) != "native"]
    if missing:
        kind = device.split(":")[0]
        return False, f"the {kind} provider has no FP8 kernels ({', '.join(missing)} would run as slow composites)"
    return True, ""


def _quantize(x, scale, dtype):
    out, amax = dispatch.op("fp8_quantize")([x._t, scale._t], [dtype])
    return Tensor(out), Tensor(amax)


def _matmul(a, b, a_inv, b_inv, trans_a, trans_b, dtype, bias=None):
    ins = [a._t, b._t, a_inv._t, b_inv._t] + ([bias._t] if bias is not None else [])
    return Tensor(dispatch.op("fp8_matmul")(ins, [int(trans_a), int(trans_b), dtype])[0])


def linear(x, weight, bias, state):
    """x[..., in] @ weight[out, in]^T + bias in FP8 (e4m3 operands, e5m2 output gradient), scaled by `state` (an
    Fp8Linear's scaling: its quantize() and tracking())."""
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"fp8 linear: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    out_dtype = amp.autocast_dtype() or x.dtype
    if out_dtype not in ("float32", "bfloat16", "float16"):
        raise TypeError(f"fp8 linear: computes in float32, bfloat16 or float16, not {out_dtype}")
    x = fusion.linear_input(x)  # a pending norm writes autocast's 16-bit dtype itself, as for a bf16 linear
    rows = x.reshape(-1, x.shape[-1])
    grads = dispatch.needs_grad(x, weight, bias)
    want = (x.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad) if grads else (0, 0, 0)
    track = state.tracking()
    # Backward reads x and the weight transposed (FP8 GEMMs take K-contiguous operands): quantized that way here,
    # in the same pass, where the recipe can (`Fp8Linear.quantize`).
    x8, x8t, inv_x, _ = state.quantize(INPUT, rows.detach(), transpose=want[1], update=track)
    w8, w8t, inv_w, _ = state.quantize(WEIGHT, weight.detach(), transpose=want[0], update=track)
    # A 16-bit output takes the bias in the GEMM's epilogue (rounded once); a float32 one adds it after.
    epilogue_bias = bias is not None and out_dtype != "float32"
    b = F.cast(bias.detach(), out_dtype) if epilogue_bias else None
    out = _matmul(x8, w8, inv_x, inv_w, False, True, out_dtype, b)
    if bias is not None and not epilogue_bias:
        out = F.add(out, bias.detach())
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    if grads:
        x_shape, x_dtype = x.shape, x.dtype
        # What backward keeps: one float8 copy of each, the transposed one where there is one.
        x_keep, x_t = (x8t, True) if x8t is not None else (x8, False)
        w_keep, w_t = (w8t, True) if w8t is not None else (w8, False)
        del x8, w8, x8t, w8t

        def backward(g):
            g2 = g.reshape(-1, g.shape[-1])
            g8, g8t, inv_g, gb = state.quantize(GRAD, g2, transpose=want[1] and x_t, colsum=want[2], update=track)
            gx = gw = None
            if want[0]:
                gx = _matmul(g8, w_keep, inv_g, inv_w, False, w_t, x_dtype).reshape(x_shape)
            if want[1]:
                if g8t is not None:
                    gw = _matmul(g8t, x_keep, inv_g, inv_x, False, True, weight.dtype)
                else:
                    gw = _matmul(g8, x_keep, inv_g, inv_x, True, False, weight.dtype)
            if want[2] and gb.dtype != bias.dtype:
                gb = F.cast(gb, bias.dtype)
            return gx, gw, gb if want[2] else None

        dispatch.record(out, (x, weight, bias), backward, "fp8_linear")
    return out


class Fp8Linear(nn.Linear):
    """nn.Linear whose forward runs in FP8 (`linear`); buffers fp8_amax_history [3, H] and fp8_scale [3] hold
    the input, weight and output-gradient scaling (delayed scaling; unused under current scaling)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, recipe=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._init_fp8(recipe or Recipe())

    def _init_fp8(self, recipe):
        self.recipe = recipe
        device = self.weight.device
        h = recipe.amax_history_len
        self.register_buffer("fp8_amax_history", tensor([[0.0] * h] * 3, dtype="float32", device=device))
        self.register_buffer("fp8_scale", tensor([1.0, 1.0, 1.0], dtype="float32", device=device))

    @classmethod
    def from_linear(cls, lin, recipe=None):
        """An Fp8Linear sharing `lin`'s weight and bias Parameters (optimizer state and ties stay as they are)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight = lin.weight
        new.bias = lin.bias
        new._init_fp8(recipe or Recipe())
        return new

    def scale(self, row, x):
        """The scale row `row` quantizes with: the delayed one, or from x's own amax (current scaling)."""
        if self.recipe.scaling == "current":
            return _scale_from(F.amax(F.abs(x.detach())).reshape(1), self._fmax(row), self.recipe.margin, None)
        return self.fp8_scale[row].detach()

    def quantize(self, row, t, transpose=False, colsum=False, update=False):
        """One use of the 2-d tensor t in row `row`'s format: (codes, the transposed codes or None, 1 / scale, t's
        float32 column sums or None). Delayed scaling: one op, fp8_quantize_delayed_, which also moves the row's
        history when `update`. Current scaling: t's amax, then fp8_quantize; no transposed copy (fp8_matmul
        transposes)."""
        dtype = E5M2 if row == GRAD else E4M3
        if self.recipe.scaling == "delayed":
            q, qt, inv, sums = dispatch.op("fp8_quantize_delayed_")(
                [t._t, self.fp8_amax_history._t, self.fp8_scale._t],
                [row, self.recipe.margin, dtype, int(bool(transpose)), int(bool(colsum)), int(bool(update))],
            )
            return Tensor(q), Tensor(qt) if transpose else None, Tensor(inv), Tensor(sums) if colsum else None
        s = self.scale(row, t)
        q, _ = _quantize(t, s, dtype)
        return q, None, T.reciprocal(s), F.cast(F.sum(t, 0), "float32") if colsum else None

    def rescale(self):
        """Every row's scale recomputed from its history (after the history was replaced: sync_amax)."""
        for row in range(3):
            m = F.amax(self.fp8_amax_history[row]).reshape(1)
            self._write1(self.fp8_scale, row, _scale_from(m, self._fmax(row), self.recipe.margin, self.fp8_scale[row]))

    def tracking(self):
        """Whether this forward's amaxes enter the histories: delayed scaling, in training mode with gradients on
        (evaluation and sampling, under no_grad, do not move the scales training uses)."""
        return self.recipe.scaling == "delayed" and self.training and autograd.is_grad_enabled()

    @staticmethod
    def _fmax(row):
        return FMAX[E5M2 if row == GRAD else E4M3]

    @staticmethod
    def _write1(buf, row, value):
        parts = [value.reshape(1) if r == row else buf[r].reshape(1) for r in range(buf.shape[0])]
        buf.copy_(F.cat(parts))

    def forward(self, x):
        return linear(x, self.weight, self.bias, self)

    def extra_repr(self):
        return f"{super().extra_repr()}, fp8={self.recipe.scaling}"


def _scale_from(amax, fmax, margin, previous):
    """fmax / amax / 2^margin (a [1] float32 tensor); where amax is 0 or not finite: `previous`, or 1."""
    amax = F.cast(amax, "float32")
    ok = T.logical_and(F.gt(amax, 0.0), T.isfinite(amax))
    fresh = F.div(tensor([fmax / 2.0**margin], dtype="float32", device=amax.device), F.where(ok, amax, 1.0))
    keep = previous.reshape(1) if previous is not None else tensor([1.0], dtype="float32", device=amax.device)
    return F.where(ok, fresh, keep).reshape(())


def sync_amax(models, all_reduce_max=None):
    """Data parallelism: makes the delayed-scaling histories of every replica in `models` (this process's), and of
    every process through all_reduce_max(tensor) (an in-place max across processes), their elementwise max, and
    rescales. Run once a step, every replica then quantizes with the same scales, as one model would, and a
    checkpoint's (rank 0's) histories are every rank's."""
    layers = [[m for m in model.modules() if isinstance(m, Fp8Linear) and m.recipe.scaling == "delayed"]
              for model in models]  # fmt: skip
    if not layers[0]:
        return
    flats = [F.cat([m.fp8_amax_history.reshape(-1) for m in ls]) for ls in layers]
    total = flats[0]
    for f in flats[1:]:
        total = F.maximum(total, f.to(total.device))
    if all_reduce_max is not None:
        all_reduce_max(total)
    for ls in layers:
        mine = total.to(ls[0].fp8_amax_history.device)
        offset = 0
        for m in ls:
            n = m.fp8_amax_history.numel()
            m.fp8_amax_history.copy_(mine[offset : offset + n].reshape(m.fp8_amax_history.shape))
            m.rescale()
            offset += n


def _is_head(name, module, tied):
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("lm_head", "head", "output") or id(module.weight) in tied


def convert(model, recipe=None, skip=None, device=None):
    """Replaces model's nn.Linear layers by Fp8Linear (same Parameters) in place and returns model. Left alone:
    output heads (a layer named lm_head, head or output, or whose weight another module shares: tied to the
    embedding), layers whose `skip(name, module)` is true, and layers whose sizes are not multiples of 16 (FP8
    tensor cores need them). Raises when the model's device has no FP8 kernels (`supported`)."""
    recipe = recipe or Recipe()
    params = list(model.parameters())
    if device is None and params:
        device = params[0].device
    if device is not None:
        ok, why = supported(device)
        if not ok:
            raise RuntimeError(f"fp8: {why}; train in bfloat16 on this device")
    owners = {}
    for _, m in model.named_modules():
        for p in m._parameters.values() if hasattr(m, "_parameters") else ():
            if p is not None:
                owners[id(p)] = owners.get(id(p), 0) + 1
    tied = {k for k, n in owners.items() if n > 1}
    converted = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear:  # exactly nn.Linear: subclasses (LoRA, parallel) keep their forward
                continue
            if _is_head(full, child, tied) or (skip is not None and skip(full, child)):
                continue
            if child.in_features % 16 or child.out_features % 16:
                continue
            setattr(module, child_name, Fp8Linear.from_linear(child, recipe))
            converted += 1
    model.fp8_layers = converted
    return model
