// The op table: one line per op (schema, tier, dtypes, backward ops, shape
// rule, doc; see op.h for the schema syntax), then the shape rules it names.
// docs/ops.md is generated from this table (./bazelw run //python:opdoc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "infinitrain/op.h"

namespace infinitrain {
namespace {

using In = std::vector<Tensor>;
using Out = std::vector<TensorMeta>;

#define RULE(name) Out name(const char* op, const In& in, const Attrs& a)
RULE(Cast);
RULE(CopyInto);
RULE(NoOutputs);
RULE(Normal);
RULE(Uniform);
RULE(Dropout);
RULE(DropoutBackward);
RULE(SameAsX);
RULE(Clamp);
RULE(UnaryBackward);
RULE(Binary);
RULE(Compare);
RULE(Where);
RULE(MaskedFill);
RULE(Axpy);
RULE(ForeachMul);
RULE(Reduce);
RULE(Amax);
RULE(Argmax);
RULE(SumSquares);
RULE(Scan);
RULE(Sort);
RULE(ForeachSumSquares);
RULE(Matmul);
RULE(Fp8Quantize);
RULE(Fp8Matmul);
RULE(Fp8AmaxPush);
RULE(Fp8QuantizeDelayed);
RULE(Linear);
RULE(LinearWeightGrad);
RULE(LinearGeluTanh);
RULE(LinearDgeluTanh);
RULE(Embedding);
RULE(EmbeddingBackward);
RULE(Gather);
RULE(ScatterAdd);
RULE(Permute);
RULE(Slice);
RULE(SliceBackward);
RULE(Concat);
RULE(Stack);
RULE(Split);
RULE(Triangle);
RULE(Softmax);
RULE(SoftmaxBackward);
RULE(LayerNorm);
RULE(LayerNormBackward);
RULE(RmsNorm);
RULE(RmsNormBackward);
RULE(AddLayerNorm);
RULE(AddLayerNormBackward);
RULE(AddRmsNorm);
RULE(AddRmsNormBackward);
RULE(SwiGlu);
RULE(SwiGluBackward);
RULE(Rope);
RULE(Sdpa);
RULE(SdpaBackward);
RULE(SdpaBthd);
RULE(SdpaBthdBackward);
RULE(CrossEntropy);
RULE(CrossEntropyBackward);
RULE(AdamW);
RULE(ForeachAdamW);
RULE(MoeTopk);
RULE(MoeTopkBackward);
RULE(MoePermute);
RULE(MoeUnpermute);
RULE(MoeUnpermuteBackward);

constexpr OpTier R = OpTier::kRequired;
constexpr OpTier F = OpTier::kFused;
constexpr DtypeSet kF = kFloatDtypes;
constexpr DtypeSet kAll = kAllDtypes;
constexpr DtypeSet kFloat32Only = DtypeBit(DataType::kFloat32);

}  // namespace

// clang-format off
extern const OpDef kOpTable[] = {
// schema                                                                    tier dtypes  backward              shape rule          doc
// ---- copy, cast, fill, random ----
{"cast(x; dtype: str) -> out",                                                  R, kAll | kFloat8Dtypes, "cast", Cast,              "x converted to dtype (floats round to nearest even; to float8, a value past the largest finite one becomes NaN for float8_e4m3fn, infinity for float8_e5m2)"},
{"copy_(dst!, src) -> ()",                                                      R, kAll, "",                   CopyInto,           "dst[...] = src, converting dtype; shapes must match"},
{"fill_(x!; value: float) -> ()",                                               R, kAll, "",                   NoOutputs,          "x[...] = value"},
{"normal_(x!; mean: float, std: float, seed: int, offset: int) -> ()",          R, kF,   "",                   Normal,             "x[i] = mean + std * N(0,1), counter-based on (seed, offset + i): the same on every device"},
{"uniform_(x!; low: float, high: float, seed: int, offset: int) -> ()",         R, kF,   "",                   Uniform,            "x[i] = low + (high - low) * U[0,1), counter-based on (seed, offset + i)"},
{"dropout(x; p: float, seed: int, offset: int) -> (out, mask)",                 R, kF,   "dropout_backward",   Dropout,            "mask[i] = U(seed, offset + i) >= p (bool); out = x * mask / (1 - p)"},
{"dropout_backward(grad, mask: bool; p: float) -> dx",                          R, kF,   "",                   DropoutBackward,    "dx = grad * mask / (1 - p)"},
// ---- elementwise unary ----
{"neg(x) -> out",                                                               R, kF,   "neg",                SameAsX,            "-x"},
{"exp(x) -> out",                                                               R, kF,   "mul",                SameAsX,            "e^x"},
{"log(x) -> out",                                                               R, kF,   "div",                SameAsX,            "natural log"},
{"sqrt(x) -> out",                                                              R, kF,   "div affine",         SameAsX,            "square root"},
{"rsqrt(x) -> out",                                                             R, kF,   "mul pow_scalar",     SameAsX,            "1 / sqrt(x)"},
{"abs(x) -> out",                                                               R, kF,   "mul gt lt",          SameAsX,            "|x|"},
{"sin(x) -> out",                                                               R, kF,   "cos mul",            SameAsX,            "sine"},
{"cos(x) -> out",                                                               R, kF,   "sin mul",            SameAsX,            "cosine"},
{"tanh(x) -> out",                                                              R, kF,   "tanh_backward",      SameAsX,            "hyperbolic tangent"},
{"sigmoid(x) -> out",                                                           R, kF,   "sigmoid_backward",   SameAsX,            "1 / (1 + e^-x)"},
{"relu(x) -> out",                                                              R, kF,   "relu_backward",      SameAsX,            "max(x, 0)"},
{"silu(x) -> out",                                                              F, kF,   "silu_backward",      SameAsX,            "x * sigmoid(x)"},
{"gelu_tanh(x) -> out",                                                         F, kF,   "gelu_tanh_backward", SameAsX,            "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"},
{"gelu(x) -> out",                                                              F, kF,   "gelu_backward",      SameAsX,            "x * Phi(x), Phi the standard normal CDF: PyTorch's exact GELU (approximate='none')"},
{"erf(x) -> out",                                                               R, kF,   "exp mul",            SameAsX,            "the error function, 2/sqrt(pi) * integral of e^(-t^2) from 0 to x"},
{"log1p(x) -> out",                                                             R, kF,   "div",                SameAsX,            "log(1 + x), accurate for small x"},
{"expm1(x) -> out",                                                             R, kF,   "mul",                SameAsX,            "e^x - 1, accurate for small x"},
{"floor(x) -> out",                                                             R, kF,   "",                   SameAsX,            "the largest integer <= x"},
{"ceil(x) -> out",                                                              R, kF,   "",                   SameAsX,            "the smallest integer >= x"},
{"round(x) -> out",                                                             R, kF,   "",                   SameAsX,            "the nearest integer, halves to even"},
{"trunc(x) -> out",                                                             R, kF,   "",                   SameAsX,            "x rounded toward zero"},
{"sign(x) -> out",                                                              R, kF,   "",                   SameAsX,            "-1, 0 or 1 by the sign of x (NaN stays NaN)"},
{"affine(x; scale: float, bias: float) -> out",                                 R, kF,   "affine",             SameAsX,            "x * scale + bias (scalar arithmetic)"},
{"pow_scalar(x; exponent: float) -> out",                                       R, kF,   "pow_scalar mul",     SameAsX,            "x ^ exponent"},
{"clamp(x; low: float, high: float) -> out",                                    R, kF,   "ge le mul",          Clamp,              "min(max(x, low), high)"},
{"tanh_backward(out, grad) -> dx",                                              R, kF,   "",                   UnaryBackward,      "grad * (1 - out^2)"},
{"sigmoid_backward(out, grad) -> dx",                                           R, kF,   "",                   UnaryBackward,      "grad * out * (1 - out)"},
{"relu_backward(x, grad) -> dx",                                                R, kF,   "",                   UnaryBackward,      "grad * (x > 0)"},
{"silu_backward(x, grad) -> dx",                                                F, kF,   "",                   UnaryBackward,      "grad * d silu(x)/dx"},
{"gelu_tanh_backward(x, grad) -> dx",                                           F, kF,   "",                   UnaryBackward,      "grad * d gelu_tanh(x)/dx"},
{"gelu_backward(x, grad) -> dx",                                                F, kF,   "",                   UnaryBackward,      "grad * (Phi(x) + x phi(x)), phi the standard normal density"},
// ---- elementwise binary (broadcasting) ----
{"add(a, b) -> out",                                                            R, kF,   "sum",                Binary,             "a + b"},
{"sub(a, b) -> out",                                                            R, kF,   "sum neg",            Binary,             "a - b"},
{"mul(a, b) -> out",                                                            R, kF,   "mul sum",            Binary,             "a * b"},
{"div(a, b) -> out",                                                            R, kF,   "div mul sum",        Binary,             "a / b"},
{"maximum(a, b) -> out",                                                        R, kF,   "ge mul",             Binary,             "max(a, b)"},
{"minimum(a, b) -> out",                                                        R, kF,   "le mul",             Binary,             "min(a, b)"},
{"pow(a, b) -> out",                                                            R, kF,   "pow mul log sum",    Binary,             "a ^ b (a tensor exponent)"},
{"fmod(a, b) -> out",                                                           R, kF,   "div trunc mul sum",  Binary,             "a - trunc(a / b) * b: the remainder with a's sign (C's fmod)"},
{"remainder(a, b) -> out",                                                      R, kF,   "div floor mul sum",  Binary,             "a - floor(a / b) * b: the remainder with b's sign (Python's %)"},
{"atan2(a, b) -> out",                                                          R, kF,   "div mul sum",        Binary,             "the angle of the point (b, a), in (-pi, pi]"},
{"eq(a, b) -> out",                                                             R, kNumericDtypes, "",         Compare,            "a == b (bool)"},
{"ne(a, b) -> out",                                                             R, kNumericDtypes, "",         Compare,            "a != b (bool)"},
{"lt(a, b) -> out",                                                             R, kNumericDtypes, "",         Compare,            "a < b (bool)"},
{"le(a, b) -> out",                                                             R, kNumericDtypes, "",         Compare,            "a <= b (bool)"},
{"gt(a, b) -> out",                                                             R, kNumericDtypes, "",         Compare,            "a > b (bool)"},
{"ge(a, b) -> out",                                                             R, kNumericDtypes, "",         Compare,            "a >= b (bool)"},
{"where(cond: bool, a, b) -> out",                                              R, kF,   "where",              Where,              "cond ? a : b, all three broadcast"},
{"masked_fill(x, mask: bool; value: float) -> out",                             R, kF,   "masked_fill",        MaskedFill,         "mask ? value : x; mask broadcasts to x's shape"},
{"axpy_(y!, x; alpha: float) -> ()",                                            R, kF,   "",                   Axpy,               "y += alpha * x (same shape and dtype)"},
{"foreach_mul_(scale, xs!...) -> ()",                                           F, kF,   "",                   ForeachMul,         "x *= scale for every x in xs (one float dtype; no two inputs sharing memory); scale 0-d, any float dtype, read on the device; the product in float32 (float64 for float64 xs), rounded once"},
// ---- reductions ----
{"sum(x; dims: ints, keepdim: int) -> out",                                     R, kF,   "fill_ add",          Reduce,             "sum over dims (all when empty)"},
{"mean(x; dims: ints, keepdim: int) -> out",                                    R, kF,   "fill_ add affine",   Reduce,             "mean over dims (all when empty)"},
{"amax(x; dims: ints, keepdim: int) -> out",                                    R, kF,   "eq div sum mul",     Amax,               "max over dims (all when empty)"},
{"argmax(x; dim: int, keepdim: int) -> out",                                    R, kF,   "",                   Argmax,             "index (int64) of the first maximum along dim"},
{"cumsum(x; dim: int, reverse: int) -> out",                                    R, kF,   "cumsum",             Scan,               "inclusive prefix sums along dim (suffix sums when reverse is 1); float32 accumulates in float64"},
{"sort(x; descending: int) -> (values, indices)",                                R, kF,   "scatter_add",        Sort,               "each row of the last dim in ascending (descending) order, NaN largest, equal values in their order; indices int64"},
{"sum_squares(x) -> out",                                                       R, kF,   "",                   SumSquares,         "sum of x^2 over all elements, accumulated in float64; 0-d float32 (float64 for float64 x)"},
{"foreach_sum_squares(xs...) -> out",                                           F, kF,   "",                   ForeachSumSquares,  "sum of x^2 over every element of every x in xs (one dtype), accumulated in float64 in an order fixed by the shapes alone; 0-d float32 (float64 for float64 xs)"},
// ---- linear algebra ----
{"matmul(a, b; trans_a: int, trans_b: int) -> out",                             R, kF,   "matmul sum",         Matmul,             "op(a) @ op(b) over the last two dims, batch dims broadcast; op transposes when trans_* is 1"},
{"linear(x, weight, bias?) -> out",                                             R, kF,   "matmul sum",         Linear,             "x[..., in] @ weight[out, in]^T + bias[out]"},
{"linear_weight_grad(grad, x; bias: int) -> (dweight, dbias)",                 F, kF,   "",                   LinearWeightGrad,   "linear's parameter gradients in one op: dweight[out, in] = grad[R, out]^T @ x[R, in] over the R rows of grad [..., out] and x [..., in] (the same leading dims); dbias[out] = grad's column sums when bias = 1, else dbias is [0]"},
{"linear_gelu_tanh(x, weight, bias?) -> (out, pre)",                           F, kF,   "linear_dgelu_tanh linear_weight_grad matmul", LinearGeluTanh, "a linear with the tanh GELU on its output: pre = x[..., in] @ weight[out, in]^T + bias[out], out = gelu_tanh(pre); pre is kept for the backward"},
{"linear_dgelu_tanh(grad, weight, pre; bias: int) -> (dpre, dbias)",          F, kF,   "",                   LinearDgeluTanh,    "the gradient through linear(gelu_tanh(pre), weight) into pre: dpre = gelu_tanh_backward(pre, grad[..., out] @ weight[out, in]) with pre [..., in]; dbias[in] = dpre's column sums when bias = 1 (the bias gradient of the linear that made pre), else dbias is [0]"},
// ---- FP8 (float8 operands, float32 accumulation) ----
{"fp8_quantize(x, scale: float32; dtype: str) -> (out, amax)",                 F, kF,   "",                   Fp8Quantize,        "out = x * scale clamped to dtype's finite range (448 for float8_e4m3fn, 57344 for float8_e5m2), rounded to nearest even in dtype (NaN stays NaN); amax = max |x| as 0-d float32 (NaN if x holds one); scale 0-d, read on the device"},
{"fp8_matmul(a, b, a_scale_inv: float32, b_scale_inv: float32, bias?; trans_a: int, trans_b: int, dtype: str) -> out", F, kFloat8Dtypes, "", Fp8Matmul, "out[M, N] = op(a) @ op(b) * a_scale_inv * b_scale_inv + bias[N], accumulated in float32 and written in dtype (float32, bfloat16 or float16); a, b 2-d float8 (not both float8_e5m2), op transposes when trans_* is 1; the scale_invs 0-d, bias in dtype"},
{"fp8_amax_push_(history!, scale!, amax; row: int, fmax: float, margin: int) -> ()", F, kFloat32Only, "",  Fp8AmaxPush,        "delayed scaling's update, in place: row `row` of history [R, H] moves one place right (its last entry drops out) and amax (0-d) enters at [row, 0]; m = the row's max, and scale[row] (scale [R]) = fmax / 2^margin / m where m > 0 and finite, else unchanged; all float32"},
{"fp8_quantize_delayed_(x, history!: float32, scale!: float32; row: int, margin: int, dtype: str, transpose: int, colsum: int, update: int) -> (out, out_t, scale_inv, colsum)", F, kF, "", Fp8QuantizeDelayed, "one tensor use under delayed scaling, in one pass over x [R, C]: with s = scale[row], out = fp8_quantize(x, s, dtype).out; out_t = out^T [C, R] when transpose is 1, else [0]; scale_inv = 1 / s (0-d); colsum = x's column sums [C] in float32 when colsum is 1, else [0]; then, when update is 1, fp8_amax_push_(history, scale, max |x|, row, dtype's largest finite value, margin)"},
// ---- indexing and shape ----
{"embedding(weight, index: int64) -> out",                                      R, kF,   "embedding_backward", Embedding,          "weight[index]: weight [V, C], index [...] -> [..., C]"},
{"embedding_backward(grad, index: int64; num_weights: int) -> dweight",         R, kF,   "",                   EmbeddingBackward,  "dweight[V, C] = sum of grad rows scattered to their index"},
{"gather(x, index: int64; dim: int) -> out",                                    R, kF,   "scatter_add",        Gather,             "out[..i..] = x[..index[..i..]..] along dim; index has x's rank"},
{"scatter_add(x, index: int64, src; dim: int) -> out",                          R, kF,   "gather",             ScatterAdd,         "out = x; out[..index[..i..]..] += src[..i..] along dim; index and src share a shape"},
{"permute(x; dims: ints) -> out",                                               R, kAll, "permute",            Permute,            "out = x with dimensions reordered (a contiguous copy)"},
{"slice(x; dim: int, start: int, end: int, step: int) -> out",                  R, kAll, "slice_backward",     Slice,              "x[start:end:step] along dim (Python slice rules, step > 0)"},
{"slice_backward(grad; shape: ints, dim: int, start: int, end: int, step: int) -> dx", R, kAll, "",            SliceBackward,      "zeros of shape with grad written at [start:end:step] along dim"},
{"concat(xs...; dim: int) -> out",                                              R, kAll, "split",              Concat,             "inputs joined along dim"},
{"stack(xs...; dim: int) -> out",                                               R, kAll, "split",              Stack,              "equal-shaped inputs joined along a new dim"},
{"split(x; dim: int, sizes: ints) -> outs...",                                  R, kAll, "concat",             Split,              "x cut along dim into pieces of the given sizes (they must sum to x.shape[dim])"},
{"tril(x; k: int) -> out",                                                      R, kF,   "tril",               Triangle,           "x with elements above diagonal k of the last two dims zeroed"},
{"triu(x; k: int) -> out",                                                      R, kF,   "triu",               Triangle,           "x with elements below diagonal k of the last two dims zeroed"},
// ---- normalisation and softmax ----
{"softmax(x; dim: int) -> out",                                                 R, kF,   "softmax_backward",   Softmax,            "exp(x) / sum exp(x) along dim"},
{"softmax_backward(out, grad; dim: int) -> dx",                                 R, kF,   "",                   SoftmaxBackward,    "out * (grad - sum(grad * out, dim))"},
{"log_softmax(x; dim: int) -> out",                                             R, kF,   "log_softmax_backward", Softmax,          "x - log sum exp(x) along dim"},
{"log_softmax_backward(out, grad; dim: int) -> dx",                             R, kF,   "",                   SoftmaxBackward,    "grad - exp(out) * sum(grad, dim)"},
{"layernorm(x, weight, bias; eps: float) -> (out, mean, rstd)",                 R, kF,   "layernorm_backward", LayerNorm,          "(x - mean) * rstd * weight + bias over the last dim; mean, rstd [...] in float32 (float64 for float64 x)"},
{"layernorm_backward(grad, x, weight, mean, rstd) -> (dx, dweight, dbias)",     R, kF,   "",                   LayerNormBackward,  "gradients of layernorm from the saved mean and rstd"},
{"rmsnorm(x, weight; eps: float) -> (out, rstd)",                               F, kF,   "rmsnorm_backward",   RmsNorm,            "x * rsqrt(mean(x^2) + eps) * weight over the last dim; rstd [...] in float32 (float64 for float64 x)"},
{"rmsnorm_backward(grad, x, weight, rstd) -> (dx, dweight)",                    F, kF,   "",                   RmsNormBackward,    "gradients of rmsnorm from the saved rstd"},
{"add_layernorm(x, y, weight, bias; eps: float, dtype: str) -> (sum, out, mean, rstd)", F, kF, "add_layernorm_backward", AddLayerNorm, "a residual add and the layernorm after it in one pass: sum = x + y in x's dtype, out = layernorm(sum) written in dtype, as layernorm then a cast ('' for x's dtype; float32 x may take a 16-bit dtype, the one autocast casts to); y in x's dtype or dtype"},
{"add_layernorm_backward(grad, x, weight, mean, rstd, residual?) -> (dx, dweight, dbias)", F, kF, "",          AddLayerNormBackward, "layernorm_backward with grad in x's dtype or (for float32 x) a 16-bit dtype, and residual (x's dtype and shape: the gradient x already has from its other uses) added to dx in the same pass"},
{"add_rmsnorm(x, y, weight; eps: float, dtype: str) -> (sum, out, rstd)",       F, kF,   "add_rmsnorm_backward", AddRmsNorm,       "add_layernorm's rmsnorm: sum = x + y in x's dtype, out = rmsnorm(sum) written in dtype"},
{"add_rmsnorm_backward(grad, x, weight, rstd, residual?) -> (dx, dweight)",    F, kF,   "",                   AddRmsNormBackward, "rmsnorm_backward with grad in x's dtype or (for float32 x) a 16-bit dtype, and residual added to dx"},
// ---- fused transformer ops ----
{"swiglu(gate, up) -> out",                                                     F, kF,   "swiglu_backward",    SwiGlu,             "silu(gate) * up"},
{"swiglu_backward(gate, up, grad) -> (dgate, dup)",                             F, kF,   "",                   SwiGluBackward,     "gradients of silu(gate) * up"},
{"rope(x, cos, sin; inverse: int) -> out",                                      F, kF,   "rope",               Rope,               "rotates pairs (x[2i], x[2i+1]) of x [B, T, H, D] by angle[t, i] given cos, sin [T, D/2] (float32, float64 for float64 x); inverse=1 rotates by -angle"},
{"sdpa(q, k, v; causal: int, scale: float) -> (out, lse)",                      F, kF,   "sdpa_backward",      Sdpa,               "softmax(q k^T * scale [+ causal mask]) v; q [B, Hq, T, D], k, v [B, Hkv, S, D], Hq % Hkv == 0 (grouped-query heads); lse [B, Hq, T] in float32 (float64 for float64 inputs)"},
{"sdpa_backward(grad, q, k, v, out, lse; causal: int, scale: float) -> (dq, dk, dv)", F, kF, "",               SdpaBackward,       "gradients of sdpa from its saved out and lse"},
{"sdpa_bthd(q, k, v; causal: int, scale: float) -> (out, lse)",                 F, kF,   "sdpa_bthd_backward", SdpaBthd,           "sdpa in the layout of the projections: q, out [B, T, Hq, D], k, v [B, S, Hkv, D] (no transposes around it); lse [B, Hq, T]"},
{"sdpa_bthd_backward(grad, q, k, v, out, lse; causal: int, scale: float) -> (dq, dk, dv)", F, kF, "",          SdpaBthdBackward,   "gradients of sdpa_bthd from its saved out and lse"},
{"cross_entropy(logits, target: int64; ignore_index: int) -> (loss, lse)",      F, kF,   "cross_entropy_backward", CrossEntropy,   "mean over rows with target != ignore_index of lse(logits) - logits[target]; logits [N, V], target [N]; loss 0-d and lse [N] in float32 (float64 for float64 logits)"},
{"cross_entropy_backward(logits, target: int64, lse, grad; ignore_index: int) -> dlogits", F, kF, "",           CrossEntropyBackward, "grad * (softmax(logits) - onehot(target)) / count, zero on ignored rows"},
// ---- mixture of experts (dropless routing) ----
{"moe_topk(logits; k: int, normalize: int) -> (weights, experts)",              F, kF,   "moe_topk_backward",  MoeTopk,            "router top-k of logits [N, E]: experts [N, k] int64, the k largest logits of each row in descending order (ties: lower expert first); weights [N, k] their softmax probabilities over all E, or over the chosen k when normalize=1; weights float32 (float64 for float64 logits)"},
{"moe_topk_backward(logits, experts: int64, grad; normalize: int) -> dlogits",  F, kF,   "",                   MoeTopkBackward,    "dlogits [N, E] of moe_topk's weights from grad [N, k] (float32, float64 for float64 logits); zero outside the chosen experts when normalize=1"},
{"moe_permute(x, experts: int64; num_experts: int) -> (out, source, counts)",   F, kF,   "moe_unpermute fill_", MoePermute,        "dropless dispatch of x [N, C] to experts [N, k]: out [N*k, C] holds row n once per choice, grouped by expert in token order; source [N*k] int64 the slot n*k+j of each row; counts [num_experts] int64 rows per expert"},
{"moe_unpermute(y, source: int64, weights) -> out",                             F, kF,   "moe_unpermute_backward", MoeUnpermute,   "combine: out[n] = sum_j weights[n, j] * y[r] over the rows r with source[r] = n*k+j; y [N*k, C], source a permutation of [0, N*k), weights [N, k] float32 (float64 for float64 y)"},
{"moe_unpermute_backward(grad, y, source: int64, weights) -> (dy, dweights)",   F, kF,   "",                   MoeUnpermuteBackward, "gradients of moe_unpermute: dy[r] = weights[s] * grad[s / k] and dweights[s] = grad[s / k] . y[r] for s = source[r]"},
// ---- optimizer ----
{"adamw_(param!, grad, m!, v!; lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> ()", F, kF, "", AdamW, "decoupled-weight-decay Adam step in place; m and v are float32 (float64 for float64 params)"},
{"foreach_adamw_(tensors!...; lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> ()", F, kF, "", ForeachAdamW, "n adamw_ steps in one, bit for bit the same: tensors are n params of one dtype (n >= 1), then their n grads, n m and n v; set k is (tensors[k], tensors[n + k], tensors[2n + k], tensors[3n + k]); grads are only read"},
};
// clang-format on

extern const size_t kOpTableSize = sizeof(kOpTable) / sizeof(kOpTable[0]);

// ---- shape rules ----

namespace {

bool IsFloat(DataType t) { return IsFloating(t); }

// Float statistics (norm stats, log-sum-exp, losses) are float32, or float64 for float64 inputs.
DataType StatType(DataType t) { return t == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32; }

int64_t Int(const Attrs& a, size_t k) { return std::get<int64_t>(a[k]); }
double Float(const Attrs& a, size_t k) {
    if (const int64_t* p = std::get_if<int64_t>(&a[k])) return static_cast<double>(*p);
    return std::get<double>(a[k]);
}
const std::vector<int64_t>& Ints(const Attrs& a, size_t k) { return std::get<std::vector<int64_t>>(a[k]); }

void CheckDtype(const char* op, const Tensor& t, DataType want, const char* what) {
    if (t.dtype() != want) {
        OpError(op, std::string(what) + " must be " + DataTypeName(want) + ", got " + DataTypeName(t.dtype()));
    }
}

void CheckSameDtype(const char* op, const Tensor& a, const Tensor& b) {
    if (a.dtype() != b.dtype()) {
        OpError(op, std::string("dtype mismatch: ") + DataTypeName(a.dtype()) + " and " + DataTypeName(b.dtype()) +
                        " (cast one with .to(dtype))");
    }
}

void CheckSameShape(const char* op, const Tensor& a, const Tensor& b, const char* what) {
    if (a.shape() != b.shape()) {
        OpError(op, std::string(what) + ": shapes " + ShapeToString(a.shape()) + " and " + ShapeToString(b.shape()) +
                        " must be equal");
    }
}

void CheckRank(const char* op, const Tensor& t, int64_t rank, const char* what) {
    if (t.dim() != rank) {
        OpError(op,
                std::string(what) + " must be " + std::to_string(rank) + "-d, got shape " + ShapeToString(t.shape()));
    }
}

// Random ops take (seed, offset) as two non-negative ints starting at attribute k.
void CheckSeed(const char* op, const Attrs& a, size_t k) {
    if (Int(a, k) < 0) OpError(op, "seed must be >= 0");
    if (Int(a, k + 1) < 0) OpError(op, "offset must be >= 0");
}

void CheckProbability(const char* op, double p) {
    if (!(p >= 0.0 && p < 1.0)) OpError(op, "p must be in [0, 1), got " + std::to_string(p));
}

// Saved statistics: one value per row of x, float32 (float64 for float64 x).
void CheckStats(const char* op, const Tensor& x, const Tensor& st, const char* what) {
    Shape rows(x.shape().begin(), x.shape().end() - 1);
    if (st.shape() != rows) OpError(op, std::string(what) + " must have shape " + ShapeToString(rows));
    CheckDtype(op, st, StatType(x.dtype()), what);
}

Shape ReduceShape(const char* op, const Shape& s, const std::vector<int64_t>& dims, bool keepdim) {
    int64_t n = static_cast<int64_t>(s.size());
    std::vector<bool> reduce(n, dims.empty());
    for (int64_t d : dims) {
        int64_t nd = NormalizeDim(op, d, n);
        if (reduce[nd]) OpError(op, "dim " + std::to_string(d) + " repeated in dims");
        reduce[nd] = true;
    }
    Shape out;
    for (int64_t i = 0; i < n; ++i) {
        if (!reduce[i]) {
            out.push_back(s[i]);
        } else if (keepdim) {
            out.push_back(1);
        }
    }
    return out;
}

Shape MatmulShape(const char* op, const Tensor& a, const Tensor& b, bool ta, bool tb) {
    if (a.dim() < 2 || b.dim() < 2) {
        OpError(op,
                "inputs must be at least 2-d, got " + ShapeToString(a.shape()) + " and " + ShapeToString(b.shape()));
    }
    int64_t m = ta ? a.size(-1) : a.size(-2), ka = ta ? a.size(-2) : a.size(-1);
    int64_t kb = tb ? b.size(-1) : b.size(-2), n = tb ? b.size(-2) : b.size(-1);
    if (ka != kb) {
        OpError(op, "inner dimensions differ: " + ShapeToString(a.shape()) + (ta ? "^T" : "") + " @ " +
                        ShapeToString(b.shape()) + (tb ? "^T" : ""));
    }
    Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
    Shape out = BroadcastShapes(op, ba, bb);
    out.push_back(m);
    out.push_back(n);
    return out;
}

Out Joined(const char* op, const In& in, const Attrs& a, bool stack) {
    const Tensor& x0 = in[0];
    int64_t nd = x0.dim() + (stack ? 1 : 0);
    if (nd == 0) OpError(op, "cannot concatenate 0-d tensors (use stack)");
    int64_t dim = NormalizeDim(op, Int(a, 0), nd);
    Shape out = x0.shape();
    int64_t total = 0;
    for (size_t k = 0; k < in.size(); ++k) {
        CheckSameDtype(op, x0, in[k]);
        if (stack) {
            CheckSameShape(op, x0, in[k], "stacked tensors");
            continue;
        }
        if (in[k].dim() != x0.dim()) OpError(op, "all inputs must have the same number of dimensions");
        for (int64_t d = 0; d < nd; ++d) {
            if (d != dim && in[k].shape()[d] != out[d]) {
                OpError(op, "shapes " + ShapeToString(x0.shape()) + " and " + ShapeToString(in[k].shape()) +
                                " differ outside dim " + std::to_string(dim));
            }
        }
        total += in[k].shape()[dim];
    }
    if (stack) {
        out.insert(out.begin() + dim, static_cast<int64_t>(in.size()));
    } else {
        out[dim] = total;
    }
    return {{out, x0.dtype()}};
}

struct SliceSpec {
    int64_t dim, start, end, step, len;
};

SliceSpec NormalizeSlice(const char* op, const Shape& s, int64_t dim, int64_t start, int64_t end, int64_t step) {
    SliceSpec r;
    r.dim = NormalizeDim(op, dim, static_cast<int64_t>(s.size()));
    int64_t n = s[r.dim];
    if (step <= 0) OpError(op, "step must be positive, got " + std::to_string(step));
    auto clampi = [n](int64_t v) { return std::min(std::max(v < 0 ? v + n : v, int64_t{0}), n); };
    r.start = clampi(start);
    r.end = std::max(clampi(end), r.start);
    r.step = step;
    r.len = (r.end - r.start + step - 1) / step;
    return r;
}

}  // namespace

namespace {

RULE(Cast) { return {{in[0].shape(), ParseDataType(std::get<std::string>(a[0]))}}; }

RULE(CopyInto) {
    CheckSameShape(op, in[0], in[1], "dst and src");
    return {};
}

RULE(NoOutputs) { return {}; }

RULE(Normal) {
    if (Float(a, 1) < 0) OpError(op, "std must be >= 0");
    CheckSeed(op, a, 2);
    return {};
}

RULE(Uniform) {
    if (Float(a, 0) > Float(a, 1)) OpError(op, "low must be <= high");
    CheckSeed(op, a, 2);
    return {};
}

RULE(Dropout) {
    CheckProbability(op, Float(a, 0));
    CheckSeed(op, a, 1);
    return {{in[0].shape(), in[0].dtype()}, {in[0].shape(), DataType::kBool}};
}

RULE(DropoutBackward) {
    CheckProbability(op, Float(a, 0));
    CheckSameShape(op, in[0], in[1], "grad and mask");
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(SameAsX) { return {{in[0].shape(), in[0].dtype()}}; }

RULE(Clamp) {
    if (Float(a, 0) > Float(a, 1)) OpError(op, "low must be <= high");
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(UnaryBackward) {
    CheckSameDtype(op, in[0], in[1]);
    CheckSameShape(op, in[0], in[1], "input and grad");
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(Binary) {
    CheckSameDtype(op, in[0], in[1]);
    return {{BroadcastShapes(op, in[0].shape(), in[1].shape()), in[0].dtype()}};
}

RULE(Compare) {
    CheckSameDtype(op, in[0], in[1]);
    return {{BroadcastShapes(op, in[0].shape(), in[1].shape()), DataType::kBool}};
}

RULE(Where) {
    CheckSameDtype(op, in[1], in[2]);
    Shape s = BroadcastShapes(op, in[0].shape(), in[1].shape());
    return {{BroadcastShapes(op, s, in[2].shape()), in[1].dtype()}};
}

RULE(MaskedFill) {
    if (BroadcastShapes(op, in[0].shape(), in[1].shape()) != in[0].shape()) {
        OpError(op, "mask " + ShapeToString(in[1].shape()) + " must broadcast to x " + ShapeToString(in[0].shape()));
    }
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(Axpy) {
    CheckSameDtype(op, in[0], in[1]);
    CheckSameShape(op, in[0], in[1], "y and x");
    return {};
}

RULE(Reduce) { return {{ReduceShape(op, in[0].shape(), Ints(a, 0), Int(a, 1) != 0), in[0].dtype()}}; }

RULE(Amax) {
    Shape out = ReduceShape(op, in[0].shape(), Ints(a, 0), Int(a, 1) != 0);
    if (in[0].numel() == 0 && Numel(out) > 0) OpError(op, "cannot take the max over an empty dimension");
    return {{out, in[0].dtype()}};
}

RULE(Argmax) {
    int64_t d = NormalizeDim(op, Int(a, 0), in[0].dim());
    if (in[0].size(d) == 0) OpError(op, "cannot take argmax over an empty dimension");
    return {{ReduceShape(op, in[0].shape(), {d}, Int(a, 1) != 0), DataType::kInt64}};
}

RULE(SumSquares) { return {{Shape{}, StatType(in[0].dtype())}}; }

RULE(Scan) {
    NormalizeDim(op, Int(a, 0), in[0].dim());
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(Sort) {
    if (in[0].dim() < 1) OpError(op, "x must be at least 1-d (the sorted dim is the last)");
    return {{in[0].shape(), in[0].dtype()}, {in[0].shape(), DataType::kInt64}};
}

// Inputs first.. of a foreach op, named name[k - first] in errors, share one float dtype.
void CheckForeachDtypes(const char* op, const In& in, size_t first, const char* name) {
    const DataType t = in[first].dtype();
    if (!IsFloat(t)) {
        OpError(op, std::string(name) + "[0] must be float32, bfloat16, float16 or float64, got " + DataTypeName(t));
    }
    for (size_t k = first + 1; k < in.size(); ++k) {
        if (in[k].dtype() != t) {
            OpError(op, std::string(name) + "[" + std::to_string(k - first) + "] is " + DataTypeName(in[k].dtype()) +
                            ", " + name + "[0] " + DataTypeName(t) + ": all " + name + " must share one dtype");
        }
    }
}

// in[first..] must not share memory: a foreach kernel writing one while another reads or writes it would race.
void CheckForeachDisjoint(const char* op, const In& in, size_t first) {
    std::vector<std::pair<uintptr_t, size_t>> spans;  // (first byte, input index)
    for (size_t k = first; k < in.size(); ++k) {
        if (in[k].nbytes()) spans.emplace_back(reinterpret_cast<uintptr_t>(in[k].data()), k);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
        const size_t a = spans[i - 1].second, b = spans[i].second;
        if (spans[i].first < spans[i - 1].first + in[a].nbytes()) {
            OpError(op, "inputs " + std::to_string(std::min(a, b)) + " and " + std::to_string(std::max(a, b)) +
                            " share memory: each tensor may appear once");
        }
    }
}

RULE(ForeachSumSquares) {
    CheckForeachDtypes(op, in, 0, "xs");
    return {{Shape{}, StatType(in[0].dtype())}};
}

RULE(ForeachMul) {
    if (in[0].dim() != 0) OpError(op, "scale must be 0-d, got shape " + ShapeToString(in[0].shape()));
    CheckForeachDtypes(op, in, 1, "xs");
    CheckForeachDisjoint(op, in, 0);
    return {};
}

RULE(Matmul) {
    CheckSameDtype(op, in[0], in[1]);
    return {{MatmulShape(op, in[0], in[1], Int(a, 0) != 0, Int(a, 1) != 0), in[0].dtype()}};
}

RULE(Fp8Quantize) {
    if (in[1].dim() != 0) OpError(op, "scale must be 0-d, got shape " + ShapeToString(in[1].shape()));
    DataType t = ParseDataType(std::get<std::string>(a[0]));
    if (!IsFloat8(t)) OpError(op, std::string("dtype must be float8_e4m3fn or float8_e5m2, got ") + DataTypeName(t));
    return {{in[0].shape(), t}, {Shape{}, DataType::kFloat32}};
}

RULE(Fp8Matmul) {
    const Tensor &x = in[0], &y = in[1];
    if (!IsFloat8(y.dtype())) OpError(op, std::string("b must be float8, got ") + DataTypeName(y.dtype()));
    if (x.dtype() == DataType::kFloat8E5M2 && y.dtype() == DataType::kFloat8E5M2) {
        OpError(op, "a and b cannot both be float8_e5m2 (FP8 tensor cores take e4m3 x e4m3 or e4m3 x e5m2)");
    }
    CheckRank(op, x, 2, "a");
    CheckRank(op, y, 2, "b");
    for (int k = 2; k < 4; ++k) {
        if (in[k].dim() != 0) OpError(op, "the scale_invs must be 0-d, got shape " + ShapeToString(in[k].shape()));
    }
    bool ta = Int(a, 0) != 0, tb = Int(a, 1) != 0;
    int64_t m = ta ? x.size(1) : x.size(0), k = ta ? x.size(0) : x.size(1);
    int64_t kb = tb ? y.size(1) : y.size(0), n = tb ? y.size(0) : y.size(1);
    if (k != kb) {
        OpError(op, "inner dimensions differ: op(a) is [" + std::to_string(m) + ", " + std::to_string(k) +
                        "], op(b) is [" + std::to_string(kb) + ", " + std::to_string(n) + "]");
    }
    DataType t = ParseDataType(std::get<std::string>(a[2]));
    if (!IsFloating(t) || t == DataType::kFloat64) {
        OpError(op, std::string("dtype must be float32, bfloat16 or float16, got ") + DataTypeName(t));
    }
    if (in.size() == 5) {
        CheckDtype(op, in[4], t, "bias");
        if (in[4].shape() != Shape{n}) {
            OpError(op, "bias must have shape [" + std::to_string(n) + "], got " + ShapeToString(in[4].shape()));
        }
    }
    return {{Shape{m, n}, t}};
}

RULE(Fp8AmaxPush) {
    const Tensor &h = in[0], &sc = in[1], &amax = in[2];
    CheckDtype(op, sc, DataType::kFloat32, "scale");
    CheckDtype(op, amax, DataType::kFloat32, "amax");
    CheckRank(op, h, 2, "history");
    if (sc.shape() != Shape{h.size(0)}) {
        OpError(op, "scale must have shape [" + std::to_string(h.size(0)) + "], got " + ShapeToString(sc.shape()));
    }
    if (amax.dim() != 0) OpError(op, "amax must be 0-d, got shape " + ShapeToString(amax.shape()));
    if (h.size(1) < 1 || h.size(1) > 4096) {
        OpError(op, "history must have 1 to 4096 columns, got " + std::to_string(h.size(1)));
    }
    const int64_t row = Int(a, 0);
    if (row < 0 || row >= h.size(0)) {
        OpError(op, "row " + std::to_string(row) + " is outside the history's " + std::to_string(h.size(0)) + " rows");
    }
    if (!(Float(a, 1) > 0) || !std::isfinite(Float(a, 1))) OpError(op, "fmax must be finite and > 0");
    if (Int(a, 2) < 0 || Int(a, 2) > 64) OpError(op, "margin must be in [0, 64]");
    return {};
}

RULE(Fp8QuantizeDelayed) {
    const Tensor &x = in[0], &h = in[1], &sc = in[2];
    CheckRank(op, x, 2, "x");
    CheckRank(op, h, 2, "history");
    if (sc.shape() != Shape{h.size(0)}) {
        OpError(op, "scale must have shape [" + std::to_string(h.size(0)) + "], got " + ShapeToString(sc.shape()));
    }
    if (h.size(1) < 1 || h.size(1) > 4096) {
        OpError(op, "history must have 1 to 4096 columns, got " + std::to_string(h.size(1)));
    }
    const int64_t row = Int(a, 0);
    if (row < 0 || row >= h.size(0)) {
        OpError(op, "row " + std::to_string(row) + " is outside the history's " + std::to_string(h.size(0)) + " rows");
    }
    if (Int(a, 1) < 0 || Int(a, 1) > 64) OpError(op, "margin must be in [0, 64]");
    DataType t = ParseDataType(std::get<std::string>(a[2]));
    if (!IsFloat8(t)) OpError(op, std::string("dtype must be float8_e4m3fn or float8_e5m2, got ") + DataTypeName(t));
    for (int k = 3; k < 6; ++k) {
        if (Int(a, k) != 0 && Int(a, k) != 1) OpError(op, "transpose, colsum and update must be 0 or 1");
    }
    const int64_t r = x.size(0), c = x.size(1);
    return {{x.shape(), t},
            {Int(a, 3) ? Shape{c, r} : Shape{0}, t},
            {Shape{}, DataType::kFloat32},
            {Shape{Int(a, 4) ? c : 0}, DataType::kFloat32}};
}

RULE(Linear) {
    CheckSameDtype(op, in[0], in[1]);
    CheckRank(op, in[1], 2, "weight");
    if (in[0].dim() < 1 || in[0].size(-1) != in[1].size(1)) {
        OpError(op, "x " + ShapeToString(in[0].shape()) + " does not match weight " + ShapeToString(in[1].shape()) +
                        " (expected x[..., " + std::to_string(in[1].size(1)) + "])");
    }
    if (in.size() == 3) {
        CheckSameDtype(op, in[0], in[2]);
        if (in[2].shape() != Shape{in[1].size(0)}) {
            OpError(op, "bias must have shape [" + std::to_string(in[1].size(0)) + "], got " +
                            ShapeToString(in[2].shape()));
        }
    }
    Shape s = in[0].shape();
    s.back() = in[1].size(0);
    return {{s, in[0].dtype()}};
}

RULE(LinearWeightGrad) {
    CheckSameDtype(op, in[0], in[1]);
    const Tensor &g = in[0], &x = in[1];
    if (g.dim() < 1 || x.dim() != g.dim() || !std::equal(g.shape().begin(), g.shape().end() - 1, x.shape().begin())) {
        OpError(op, "grad " + ShapeToString(g.shape()) + " and x " + ShapeToString(x.shape()) +
                        " must share their leading dims (grad [..., out], x [..., in])");
    }
    const int64_t bias = Int(a, 0);
    if (bias != 0 && bias != 1) OpError(op, "bias must be 0 or 1, got " + std::to_string(bias));
    return {{{g.size(-1), x.size(-1)}, g.dtype()}, {{bias ? g.size(-1) : 0}, g.dtype()}};
}

RULE(LinearGeluTanh) {
    Shape s = Linear(op, in, a)[0].shape;
    return {{s, in[0].dtype()}, {s, in[0].dtype()}};
}

RULE(LinearDgeluTanh) {
    CheckRank(op, in[1], 2, "weight");
    CheckSameDtype(op, in[0], in[1]);
    CheckSameDtype(op, in[0], in[2]);
    const Tensor &g = in[0], &w = in[1], &pre = in[2];
    if (g.dim() < 1 || g.size(-1) != w.size(0) || pre.dim() != g.dim() || pre.size(-1) != w.size(1) ||
        !std::equal(g.shape().begin(), g.shape().end() - 1, pre.shape().begin())) {
        OpError(op, "grad " + ShapeToString(g.shape()) + ", weight " + ShapeToString(w.shape()) + " and pre " +
                        ShapeToString(pre.shape()) +
                        " do not fit (expected grad [..., out], weight [out, in], pre [..., in])");
    }
    const int64_t bias = Int(a, 0);
    if (bias != 0 && bias != 1) OpError(op, "bias must be 0 or 1, got " + std::to_string(bias));
    return {{pre.shape(), pre.dtype()}, {{bias ? w.size(1) : 0}, pre.dtype()}};
}

RULE(Embedding) {
    CheckRank(op, in[0], 2, "weight");
    Shape s = in[1].shape();
    s.push_back(in[0].size(1));
    return {{s, in[0].dtype()}};
}

RULE(EmbeddingBackward) {
    Shape s = in[1].shape();
    s.push_back(in[0].dim() ? in[0].size(-1) : 0);
    if (s != in[0].shape()) OpError(op, "grad " + ShapeToString(in[0].shape()) + " must be index's shape plus [C]");
    int64_t v = Int(a, 0);
    if (v < 0) OpError(op, "num_weights must be >= 0");
    return {{Shape{v, in[0].size(-1)}, in[0].dtype()}};
}

// gather/scatter_add: index has x's rank and matches x outside dim.
void CheckIndexLike(const char* op, const Tensor& x, const Tensor& index, int64_t dim) {
    int64_t d = NormalizeDim(op, dim, x.dim());
    if (index.dim() != x.dim()) OpError(op, "index must have x's number of dimensions");
    for (int64_t k = 0; k < x.dim(); ++k) {
        if (k != d && index.size(k) != x.size(k)) {
            OpError(op, "index " + ShapeToString(index.shape()) + " must match x " + ShapeToString(x.shape()) +
                            " outside dim " + std::to_string(d));
        }
    }
}

RULE(Gather) {
    CheckIndexLike(op, in[0], in[1], Int(a, 0));
    return {{in[1].shape(), in[0].dtype()}};
}

RULE(ScatterAdd) {
    CheckSameDtype(op, in[0], in[2]);
    CheckSameShape(op, in[1], in[2], "index and src");
    CheckIndexLike(op, in[0], in[1], Int(a, 0));
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(Permute) {
    const auto& dims = Ints(a, 0);
    int64_t n = in[0].dim();
    if (static_cast<int64_t>(dims.size()) != n) OpError(op, "dims must list all " + std::to_string(n) + " dimensions");
    std::vector<bool> seen(n, false);
    Shape s(n);
    for (int64_t k = 0; k < n; ++k) {
        int64_t d = NormalizeDim(op, dims[k], n);
        if (seen[d]) OpError(op, "dims must be a permutation, " + std::to_string(d) + " repeats");
        seen[d] = true;
        s[k] = in[0].shape()[d];
    }
    return {{s, in[0].dtype()}};
}

RULE(Slice) {
    SliceSpec sp = NormalizeSlice(op, in[0].shape(), Int(a, 0), Int(a, 1), Int(a, 2), Int(a, 3));
    Shape s = in[0].shape();
    s[sp.dim] = sp.len;
    return {{s, in[0].dtype()}};
}

RULE(SliceBackward) {
    const Shape& shape = Ints(a, 0);
    for (int64_t d : shape) {
        if (d < 0) OpError(op, "shape " + ShapeToString(shape) + " has a negative dimension");
    }
    SliceSpec sp = NormalizeSlice(op, shape, Int(a, 1), Int(a, 2), Int(a, 3), Int(a, 4));
    Shape g = shape;
    g[sp.dim] = sp.len;
    if (g != in[0].shape()) {
        OpError(op, "grad " + ShapeToString(in[0].shape()) + " must have shape " + ShapeToString(g));
    }
    return {{shape, in[0].dtype()}};
}

RULE(Concat) { return Joined(op, in, a, false); }

RULE(Stack) { return Joined(op, in, a, true); }

RULE(Split) {
    int64_t d = NormalizeDim(op, Int(a, 0), in[0].dim());
    int64_t total = 0;
    Out out;
    for (int64_t s : Ints(a, 1)) {
        if (s < 0) OpError(op, "sizes must be >= 0");
        total += s;
        Shape sh = in[0].shape();
        sh[d] = s;
        out.push_back({sh, in[0].dtype()});
    }
    if (total != in[0].size(d)) {
        OpError(op, "sizes sum to " + std::to_string(total) + " but dim " + std::to_string(d) + " has " +
                        std::to_string(in[0].size(d)));
    }
    return out;
}

RULE(Triangle) {
    if (in[0].dim() < 2) OpError(op, "x must be at least 2-d");
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(Softmax) {
    NormalizeDim(op, Int(a, 0), in[0].dim());
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(SoftmaxBackward) {
    NormalizeDim(op, Int(a, 0), in[0].dim());
    CheckSameDtype(op, in[0], in[1]);
    CheckSameShape(op, in[0], in[1], "out and grad");
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(LayerNorm) {
    if (in[0].dim() < 1) OpError(op, "x must be at least 1-d");
    Shape c{in[0].size(-1)};
    for (int k = 1; k < 3; ++k) {
        CheckSameDtype(op, in[0], in[k]);
        if (in[k].shape() != c) {
            OpError(op,
                    "weight and bias must have shape " + ShapeToString(c) + ", got " + ShapeToString(in[k].shape()));
        }
    }
    Shape rows(in[0].shape().begin(), in[0].shape().end() - 1);
    DataType st = StatType(in[0].dtype());
    return {{in[0].shape(), in[0].dtype()}, {rows, st}, {rows, st}};
}

RULE(LayerNormBackward) {
    CheckSameShape(op, in[0], in[1], "grad and x");
    CheckSameDtype(op, in[0], in[1]);
    CheckSameDtype(op, in[1], in[2]);
    if (in[1].dim() < 1) OpError(op, "x must be at least 1-d");
    Shape c{in[1].size(-1)};
    if (in[2].shape() != c) OpError(op, "weight must have shape " + ShapeToString(c));
    CheckStats(op, in[1], in[3], "mean");
    CheckStats(op, in[1], in[4], "rstd");
    return {{in[1].shape(), in[1].dtype()}, {c, in[1].dtype()}, {c, in[1].dtype()}};
}

RULE(RmsNorm) {
    CheckSameDtype(op, in[0], in[1]);
    if (in[0].dim() < 1 || in[1].shape() != Shape{in[0].size(-1)}) {
        OpError(op, "weight must have shape [" + std::to_string(in[0].dim() ? in[0].size(-1) : 0) + "], got " +
                        ShapeToString(in[1].shape()));
    }
    Shape rows(in[0].shape().begin(), in[0].shape().end() - 1);
    return {{in[0].shape(), in[0].dtype()}, {rows, StatType(in[0].dtype())}};
}

RULE(RmsNormBackward) {
    CheckSameShape(op, in[0], in[1], "grad and x");
    CheckSameDtype(op, in[0], in[1]);
    CheckSameDtype(op, in[1], in[2]);
    if (in[1].dim() < 1) OpError(op, "x must be at least 1-d");
    Shape c{in[1].size(-1)};
    if (in[2].shape() != c) OpError(op, "weight must have shape " + ShapeToString(c));
    CheckStats(op, in[1], in[3], "rstd");
    return {{in[1].shape(), in[1].dtype()}, {c, in[1].dtype()}};
}

// The dtype a fused norm writes out in: x's ('' or x's name), or a 16-bit float for float32 x.
DataType NormOutType(const char* op, const Tensor& x, const std::string& name) {
    if (name.empty()) return x.dtype();
    DataType o;
    try {
        o = ParseDataType(name);
    } catch (const std::exception&) {
        OpError(op, "dtype must be a dtype name ('' for x's), got '" + name + "'");
    }
    if (o != x.dtype() && !(x.dtype() == DataType::kFloat32 && (o == DataType::kBFloat16 || o == DataType::kFloat16))) {
        OpError(op, "dtype must be x's (" + std::string(DataTypeName(x.dtype())) +
                        ") or, for float32 x, bfloat16 or float16; got " + name);
    }
    return o;
}

// in: x, y, weight[, bias]; returns sum, out and the row statistics.
Out AddNorm(const char* op, const In& in, const Attrs& a, int params) {
    const Tensor &x = in[0], &y = in[1];
    if (x.dim() < 1) OpError(op, "x must be at least 1-d");
    CheckSameShape(op, x, y, "x and y");
    const DataType o = NormOutType(op, x, std::get<std::string>(a[1]));
    if (y.dtype() != x.dtype() && y.dtype() != o) {
        OpError(op, std::string("y must be ") + DataTypeName(x.dtype()) + (o != x.dtype() ? " or " : "") +
                        (o != x.dtype() ? DataTypeName(o) : "") + ", got " + DataTypeName(y.dtype()));
    }
    const Shape c{x.size(-1)};
    for (int k = 2; k < 2 + params; ++k) {
        CheckDtype(op, in[k], x.dtype(), k == 2 ? "weight" : "bias");
        if (in[k].shape() != c) {
            OpError(op, std::string(k == 2 ? "weight" : "bias") + " must have shape " + ShapeToString(c) + ", got " +
                            ShapeToString(in[k].shape()));
        }
    }
    const Shape rows(x.shape().begin(), x.shape().end() - 1);
    const DataType st = StatType(x.dtype());
    Out out{{x.shape(), x.dtype()}, {x.shape(), o}, {rows, st}};
    if (params == 2) out.push_back({rows, st});
    return out;
}

// in: grad, x, weight, stats..., [residual]; returns dx and the parameter gradients.
Out AddNormBackward(const char* op, const In& in, int stats, int params) {
    const Tensor &g = in[0], &x = in[1], &w = in[2];
    CheckSameShape(op, g, x, "grad and x");
    if (g.dtype() != x.dtype() &&
        !(x.dtype() == DataType::kFloat32 && (g.dtype() == DataType::kBFloat16 || g.dtype() == DataType::kFloat16))) {
        OpError(op, std::string("grad must be ") + DataTypeName(x.dtype()) +
                        (x.dtype() == DataType::kFloat32 ? ", bfloat16 or float16" : "") + ", got " +
                        DataTypeName(g.dtype()));
    }
    if (x.dim() < 1) OpError(op, "x must be at least 1-d");
    const Shape c{x.size(-1)};
    CheckDtype(op, w, x.dtype(), "weight");
    if (w.shape() != c) OpError(op, "weight must have shape " + ShapeToString(c));
    for (int k = 0; k < stats; ++k) CheckStats(op, x, in[3 + k], stats == 2 && k == 0 ? "mean" : "rstd");
    if (in.size() > static_cast<size_t>(3 + stats)) {
        const Tensor& r = in[3 + stats];
        CheckSameShape(op, r, x, "residual and x");
        CheckDtype(op, r, x.dtype(), "residual");
    }
    Out out{{x.shape(), x.dtype()}, {c, x.dtype()}};
    if (params == 2) out.push_back({c, x.dtype()});
    return out;
}

RULE(AddLayerNorm) { return AddNorm(op, in, a, 2); }
RULE(AddRmsNorm) { return AddNorm(op, in, a, 1); }
RULE(AddLayerNormBackward) { return AddNormBackward(op, in, 2, 2); }
RULE(AddRmsNormBackward) { return AddNormBackward(op, in, 1, 1); }

RULE(SwiGlu) {
    CheckSameDtype(op, in[0], in[1]);
    CheckSameShape(op, in[0], in[1], "gate and up");
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(SwiGluBackward) {
    for (int k = 1; k < 3; ++k) {
        CheckSameDtype(op, in[0], in[k]);
        CheckSameShape(op, in[0], in[k], "gate, up and grad");
    }
    return {{in[0].shape(), in[0].dtype()}, {in[0].shape(), in[0].dtype()}};
}

RULE(Rope) {
    CheckRank(op, in[0], 4, "x");
    int64_t T = in[0].size(1), D = in[0].size(3);
    if (D % 2) OpError(op, "head dim must be even, got " + std::to_string(D));
    for (int k = 1; k < 3; ++k) {
        CheckDtype(op, in[k], StatType(in[0].dtype()), "cos/sin");
        if (in[k].shape() != Shape{T, D / 2}) {
            OpError(op, "cos/sin must have shape [" + std::to_string(T) + ", " + std::to_string(D / 2) + "], got " +
                            ShapeToString(in[k].shape()));
        }
    }
    return {{in[0].shape(), in[0].dtype()}};
}

// q, k, v of sdpa (and of its backward, at `first`); `bthd`: the tensors are [B, T, H, D], not [B, H, T, D].
Out SdpaShapes(const char* op, const In& in, size_t first, const Attrs& a, bool bthd = false) {
    const Tensor &q = in[first], &k = in[first + 1], &v = in[first + 2];
    if (!IsFloat(q.dtype())) OpError(op, std::string("q must be a float tensor, got ") + DataTypeName(q.dtype()));
    for (const Tensor* t : {&q, &k, &v}) CheckRank(op, *t, 4, "q, k and v");
    CheckSameDtype(op, q, k);
    CheckSameDtype(op, q, v);
    CheckSameShape(op, k, v, "k and v");
    const int h = bthd ? 2 : 1, t = bthd ? 1 : 2;  // head and sequence dims
    const Shape& qs = q.shape();
    const Shape& ks = k.shape();
    if (qs[0] != ks[0] || qs[3] != ks[3] || ks[h] == 0 || qs[h] % ks[h] != 0) {
        OpError(op, "q " + ShapeToString(qs) + " and k " + ShapeToString(ks) +
                        " must share batch and head dim, with q heads a multiple of k heads" +
                        (bthd ? " (layout [B, T, H, D])" : ""));
    }
    if (Int(a, 0) && qs[t] != ks[t]) OpError(op, "causal attention needs equal query and key lengths");
    return {{qs, q.dtype()}, {Shape{qs[0], qs[h], qs[t]}, StatType(q.dtype())}};
}

Out SdpaBackwardShapes(const char* op, const In& in, const Attrs& a, bool bthd) {
    Out fwd = SdpaShapes(op, in, 1, a, bthd);
    CheckSameShape(op, in[0], in[1], "grad and q");
    CheckSameShape(op, in[4], in[1], "out and q");
    CheckSameDtype(op, in[0], in[1]);
    CheckSameDtype(op, in[4], in[1]);
    if (in[5].shape() != fwd[1].shape) OpError(op, "lse must have shape " + ShapeToString(fwd[1].shape));
    CheckDtype(op, in[5], fwd[1].dtype, "lse");
    return {{in[1].shape(), in[1].dtype()}, {in[2].shape(), in[2].dtype()}, {in[3].shape(), in[3].dtype()}};
}

RULE(Sdpa) { return SdpaShapes(op, in, 0, a); }
RULE(SdpaBackward) { return SdpaBackwardShapes(op, in, a, false); }
RULE(SdpaBthd) { return SdpaShapes(op, in, 0, a, true); }
RULE(SdpaBthdBackward) { return SdpaBackwardShapes(op, in, a, true); }

RULE(CrossEntropy) {
    CheckRank(op, in[0], 2, "logits");
    if (in[1].shape() != Shape{in[0].size(0)}) {
        OpError(op,
                "target must have shape [" + std::to_string(in[0].size(0)) + "], got " + ShapeToString(in[1].shape()));
    }
    DataType st = StatType(in[0].dtype());
    return {{Shape{}, st}, {Shape{in[0].size(0)}, st}};
}

RULE(CrossEntropyBackward) {
    Out fwd = CrossEntropy(op, {in[0], in[1]}, a);
    for (int k = 2; k < 4; ++k) {
        const TensorMeta& want = fwd[k == 2 ? 1 : 0];
        const char* what = k == 2 ? "lse" : "grad";
        CheckDtype(op, in[k], want.dtype, what);
        if (in[k].shape() != want.shape)
            OpError(op, std::string(what) + " must have shape " + ShapeToString(want.shape));
    }
    return {{in[0].shape(), in[0].dtype()}};
}

void CheckAdamWSet(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v) {
    CheckSameDtype(op, param, grad);
    for (const Tensor* t : {&grad, &m, &v}) CheckSameShape(op, param, *t, "param, grad, m and v");
    CheckDtype(op, m, StatType(param.dtype()), "m");
    CheckDtype(op, v, StatType(param.dtype()), "v");
}

RULE(AdamW) {
    CheckAdamWSet(op, in[0], in[1], in[2], in[3]);
    if (Int(a, 5) < 1) OpError(op, "step must be >= 1");
    return {};
}

// adamw_'s checks on every set, which errors name by its inputs.
RULE(ForeachAdamW) {
    if (in.size() % 4 != 0) {
        OpError(op,
                "expected 4n tensors (n params, then their n grads, n m and n v), got " + std::to_string(in.size()));
    }
    const size_t n = in.size() / 4;
    for (size_t k = 0; k < n; ++k) {
        auto where = [&] {
            return "set " + std::to_string(k) + " (inputs " + std::to_string(k) + ", " + std::to_string(n + k) + ", " +
                   std::to_string(2 * n + k) + ", " + std::to_string(3 * n + k) + "): ";
        };
        if (in[k].dtype() != in[0].dtype()) {
            OpError(op, where() + "param is " + DataTypeName(in[k].dtype()) + ", set 0's " +
                            DataTypeName(in[0].dtype()) + ": one param dtype per call");
        }
        try {
            CheckAdamWSet("", in[k], in[n + k], in[2 * n + k], in[3 * n + k]);
        } catch (const std::invalid_argument& e) {
            OpError(op, where() + e.what());
        }
    }
    if (Int(a, 5) < 1) OpError(op, "step must be >= 1");
    CheckForeachDisjoint(op, in, 0);
    return {};
}

// moe_*: the router's output rows [N, k]; 1 <= k <= E.
void CheckRoutes(const char* op, const Tensor& routes, int64_t n, int64_t experts, const char* what) {
    CheckRank(op, routes, 2, what);
    if (routes.size(0) != n || routes.size(1) < 1 || routes.size(1) > experts) {
        OpError(op, std::string(what) + " must have shape [" + std::to_string(n) +
                        ", k] with 1 <= k <= " + std::to_string(experts) + ", got " + ShapeToString(routes.shape()));
    }
}

RULE(MoeTopk) {
    CheckRank(op, in[0], 2, "logits");
    int64_t n = in[0].size(0), e = in[0].size(1), k = Int(a, 0);
    if (k < 1 || k > e) OpError(op, "k must be in [1, " + std::to_string(e) + "], got " + std::to_string(k));
    return {{Shape{n, k}, StatType(in[0].dtype())}, {Shape{n, k}, DataType::kInt64}};
}

RULE(MoeTopkBackward) {
    CheckRank(op, in[0], 2, "logits");
    CheckRoutes(op, in[1], in[0].size(0), in[0].size(1), "experts");
    CheckDtype(op, in[2], StatType(in[0].dtype()), "grad");
    CheckSameShape(op, in[1], in[2], "experts and grad");
    return {{in[0].shape(), in[0].dtype()}};
}

RULE(MoePermute) {
    CheckRank(op, in[0], 2, "x");
    int64_t e = Int(a, 0);
    if (e < 1) OpError(op, "num_experts must be >= 1, got " + std::to_string(e));
    CheckRoutes(op, in[1], in[0].size(0), e, "experts");
    int64_t rows = in[1].numel();
    return {{Shape{rows, in[0].size(1)}, in[0].dtype()}, {Shape{rows}, DataType::kInt64}, {Shape{e}, DataType::kInt64}};
}

// y [N*k, C], source [N*k], weights [N, k] of the stat dtype.
void CheckCombine(const char* op, const Tensor& y, const Tensor& source, const Tensor& w) {
    CheckRank(op, y, 2, "y");
    CheckRank(op, w, 2, "weights");
    CheckDtype(op, w, StatType(y.dtype()), "weights");
    if (source.shape() != Shape{y.size(0)} || w.numel() != y.size(0)) {
        OpError(op, "y " + ShapeToString(y.shape()) + ", source " + ShapeToString(source.shape()) + " and weights " +
                        ShapeToString(w.shape()) + " must be [N*k, C], [N*k] and [N, k]");
    }
}

RULE(MoeUnpermute) {
    CheckCombine(op, in[0], in[1], in[2]);
    return {{Shape{in[2].size(0), in[0].size(1)}, in[0].dtype()}};
}

RULE(MoeUnpermuteBackward) {
    CheckCombine(op, in[1], in[2], in[3]);
    CheckSameDtype(op, in[0], in[1]);
    Shape g{in[3].size(0), in[1].size(1)};
    if (in[0].shape() != g)
        OpError(op, "grad must have shape " + ShapeToString(g) + ", got " + ShapeToString(in[0].shape()));
    return {{in[1].shape(), in[1].dtype()}, {in[3].shape(), in[3].dtype()}};
}

}  // namespace
}  // namespace infinitrain
