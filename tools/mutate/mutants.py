"""The mutants tools/mutate/mutate.py applies: realistic bugs of the kinds the audit seeded (dropped terms, swapped
operands, off-by-one bounds, wrong reductions, ignored flags, thread splits), each with the suites that should
notice it. `old` must occur exactly once in `path`."""

from typing import NamedTuple


class Mutant(NamedTuple):
    id: str
    path: str
    old: str
    new: str
    note: str
    tests: tuple

    @property
    def kind(self):
        return "cpp" if self.path.endswith((".cc", ".h")) else "py"


MODELS = ("tests/models/test_model_reference.py", "tests/io/test_llmc_files.py", "tests/models/test_models.py")
TRAIN = ("tests/train/test_train.py", "tests/train/test_train_flags.py", "tests/train/test_train_flag_effects.py")
NN = (
    "tests/core/test_nn_optim.py",
    "tests/core/test_autograd.py",
    "tests/models/test_model_reference.py",
    "tests/models/test_models.py",
)
DATA = ("tests/io/test_data.py", "tests/io/test_llmc_files.py")


def ops(*files):
    """An op suite plus the extreme-input suite and the model references (the kernels under a model)."""
    return tuple(f"tests/ops/test_ops_{f}.py" for f in files) + (
        "tests/ops/test_ops_extreme.py",
        "tests/models/test_model_reference.py",
    )


GPT2, LLAMA = "python/infinitrain/models/gpt2.py", "python/infinitrain/models/llama3.py"
SAMPLING = "python/infinitrain/models/sampling.py"
STRATEGY, TRAINER = "python/infinitrain/training/strategy.py", "python/infinitrain/training/trainer.py"
NORM, LOSS, ATTN = (
    "infinitrain/kernels/cpu/norm.cc",
    "infinitrain/kernels/cpu/loss.cc",
    "infinitrain/kernels/cpu/attention.cc",
)
GEMM, REDUCE = "infinitrain/kernels/cpu/gemm.cc", "infinitrain/kernels/cpu/reduce.cc"

MUTANTS = [
    # ---- models ----
    Mutant(
        "P1",
        GPT2,
        "x = F.embedding(idx, head) + self.wpe.weight[:T]",
        "x = F.embedding(idx, head)",
        "GPT-2 without position embeddings",
        MODELS,
    ),
    Mutant(
        "P29",
        "python/infinitrain/functional.py",
        "ins = [g, sd, params[0], *stats] + ([] if pending is None else [pending])",
        "ins = [g, sd, params[0], *stats]",
        "add_layer_norm's backward drops the gradient it folds (the residual stream's)",
        NN,
    ),
    Mutant(
        "P30",
        GPT2,
        "x = x + self.attn(self.ln_1(x))",
        "x = self.attn(self.ln_1(x))",
        "GPT-2 drops the residual stream around attention",
        MODELS,
    ),
    Mutant(
        "P31",
        "python/infinitrain/fusion.py",
        "outs = dispatch.call(op, [a, b, *params],",
        "outs = dispatch.call(op, [a, a, *params],",
        "the fused residual add + norm adds the residual to itself (the models train through it)",
        TRAIN + ("tests/core/test_compile.py",),
    ),
    Mutant(
        "P2",
        GPT2,
        "y = F.attention_bthd(q, k, v, is_causal=True)  #",
        "y = F.attention_bthd(q, k, v, is_causal=False)  #",
        "GPT-2 attention not causal",
        MODELS,
    ),
    Mutant(
        "P3",
        GPT2,
        "            lambda b: b.ln_1.weight,\n            lambda b: b.ln_1.bias,",
        "            lambda b: b.ln_1.bias,\n            lambda b: b.ln_1.weight,",
        "GPT-2 llm.c file: ln_1 weight and bias swapped (same shape)",
        MODELS,
    ),
    Mutant(
        "P4",
        LLAMA,
        "q = F.rope(q.reshape(B, T, nh, hd), cos, sin)\n        k = F.rope(k.reshape(B, T, nkv, hd), cos, sin)\n"
        "        y = F.attention_bthd(q, k, v.reshape(B, T, nkv, hd), is_causal=True)  #",
        "q = F.rope(q.reshape(B, T, nh, hd), cos, sin)\n        k = k.reshape(B, T, nkv, hd)\n"
        "        y = F.attention_bthd(q, k, v.reshape(B, T, nkv, hd), is_causal=True)  #",
        "LLaMA 3 without RoPE on the keys",
        MODELS,
    ),
    Mutant(
        "P5",
        LLAMA,
        "scaled = (1 - smooth) * freqs / factor + smooth * freqs",
        "scaled = freqs",
        "LLaMA 3.1 RoPE scaling: the blended band left unscaled",
        MODELS,
    ),
    Mutant(
        "P6",
        LLAMA,
        "def forward(self, x):\n        return self.c_proj(F.swiglu(self.c_fc2(x), self.c_fc(x)))",
        "def forward(self, x):\n        return self.c_proj(F.swiglu(self.c_fc(x), self.c_fc2(x)))",
        "LLaMA 3 SwiGLU gate and up swapped",
        MODELS,
    ),
    Mutant(
        "P7",
        LLAMA,
        "((hidden + self.multiple_of - 1) // self.multiple_of)",
        "(hidden // self.multiple_of)",
        "LLaMA 3 MLP width rounded down, not up, to multiple_of",
        MODELS,
    ),
    Mutant(
        "P8",
        SAMPLING,
        "last = np.where(last < kth, -np.inf, last)",
        "last = np.where(last <= kth, -np.inf, last)",
        "top-k keeps k - 1 tokens",
        ("tests/models/test_models.py", "tests/train/test_train_flags.py"),
    ),
    Mutant(
        "P9",
        SAMPLING,
        "last = last / temperature",
        "last = last",
        "sampling temperature ignored",
        ("tests/models/test_models.py", "tests/train/test_train_flags.py"),
    ),
    # ---- train CLI ----
    Mutant(
        "P10",
        STRATEGY,
        "loss = loss * (1.0 / accum)",
        "loss = loss * 1.0",
        "gradient accumulation sums instead of averaging micro-batches",
        TRAIN,
    ),
    Mutant(
        "P11",
        STRATEGY,
        "cfg.optimizer, cfg.learning_rate, cfg.weight_decay",
        "cfg.optimizer, cfg.learning_rate, 0.0",
        "--weight_decay ignored",
        TRAIN,
    ),
    Mutant("P12", STRATEGY, "clip = cfg.grad_clip or None", "clip = None", "--grad_clip ignored", TRAIN),
    Mutant(
        "P13",
        TRAINER,
        "llmc_filepath=cfg.llmc_filepath,",
        'llmc_filepath="",',
        "--llmc_filepath ignored",
        TRAIN,
    ),
    Mutant(
        "P14",
        STRATEGY,
        'all_reduce(comm, p.grad, "avg")',
        'all_reduce(comm, p.grad, "sum")',
        "data parallelism sums gradients instead of averaging",
        TRAIN,
    ),
    Mutant(
        "P15",
        STRATEGY,
        "for _ in range(min(batches, ",
        "for _ in range(min(2**62, ",  # every batch of the epoch
        "--val_batches ignored",
        TRAIN,
    ),
    Mutant(
        "P16",
        TRAINER,
        "        print(line, flush=True)\n        self.outputs.log.write(line)\n",
        "        print(line, flush=True)\n",
        "--log_file gets no step lines",
        TRAIN,
    ),
    Mutant(
        "P17",
        "python/infinitrain/training/config.py",
        'return self.dtype == "bfloat16"',
        "return False",
        "--dtype ignored",
        TRAIN,
    ),
    # ---- nn, optim, autograd, data ----
    Mutant(
        "P18",
        "python/infinitrain/optim/optimizers.py",
        "coef = F.clamp(F.pow(F.affine(norm, 1.0, 1e-6), -1.0) * float(max_norm), None, 1.0)",
        "coef = F.pow(F.affine(norm, 1.0, 1e-6), -1.0) * float(max_norm)",
        "clip_grad_norm_ scales small gradients up (coefficient not capped at 1)",
        NN + TRAIN,
    ),
    Mutant(
        "P19",
        "python/infinitrain/nn/modules.py",
        "return F.rms_norm(x, self.weight, self.eps, low_output",
        "return F.rms_norm(x, self.weight, 1e-5, low_output",
        "RMSNorm module ignores its eps",
        NN,
    ),
    Mutant(
        "P20",
        "python/infinitrain/functional.py",
        "return Tensor(dx), Tensor(dw), Tensor(db)",
        "return Tensor(dx), Tensor(dw), Tensor(dw)",
        "layer_norm's bias gradient is the weight's",
        NN,
    ),
    Mutant(
        "P21",
        "python/infinitrain/functional.py",
        '_run1("rope", [g, cos, sin], [1])',
        '_run1("rope", [g, cos, sin], [0])',
        "rope's backward rotates forward instead of back",
        NN,
    ),
    Mutant(
        "P22",
        "python/infinitrain/optim/lr_scheduler.py",
        "return min_lr + coeff * (max_lr - min_lr)",
        "return coeff * max_lr",
        "cosine schedule decays to 0, not to the minimum",
        ("tests/core/test_nn_optim.py",) + TRAIN,
    ),
    Mutant(
        "P23",
        "python/infinitrain/data/loader.py",
        "self.n_chunks = (len(tokens) - 1) // self.chunk",
        "self.n_chunks = len(tokens) // self.chunk",
        "loader counts a last chunk without its target token",
        DATA,
    ),
    Mutant(
        "P24",
        "python/infinitrain/data/tokenizer.py",
        "pieces.append(data[pos + 1 : pos + 1 + n])",
        "pieces.append(data[pos : pos + n])",
        "tokenizer pieces read one byte early",
        DATA,
    ),
    Mutant(
        "P25",
        "python/infinitrain/optim/optimizers.py",
        'dispatch.call("foreach_adamw_", params + grads + m + v, attrs)',
        'dispatch.call("foreach_adamw_", params + grads + v + m, attrs)',
        "AdamW hands foreach_adamw_ the second moments in place of the first",
        NN,
    ),
    Mutant(
        "P26",
        "python/infinitrain/autograd.py",
        "sole = _STEAL and sys.getrefcount(g) == 2 and",
        "sole = _STEAL and",
        "autograd hands a gradient that other inputs share to a leaf's .grad without copying it",
        ("tests/core/test_autograd.py",),
    ),
    Mutant(
        "P27",
        "python/infinitrain/autograd.py",
        "sys.getrefcount(g) == 2 and sys.getrefcount(g._t) == 2 and",
        "sys.getrefcount(g) == 2 and",
        "autograd hands a leaf a gradient whose native tensor another wrapper still holds",
        ("tests/core/test_autograd.py",),
    ),
    Mutant(
        "P28",
        "python/infinitrain/functional.py",
        "[g._t, xd._t], [int(want_b)]",
        "[g._t, xd._t], [0]",
        "linear's backward never asks linear_weight_grad for the bias gradient",
        ("tests/core/test_autograd.py", "tests/models/test_models.py"),
    ),
    # ---- kernels ----
    Mutant(
        "K1",
        "infinitrain/kernels/cpu/common.h",
        "e = b + chunk < n ? b + chunk : n;",
        "e = b + chunk < n ? b + chunk : n - 1;",
        "ParallelFor: the last thread's clipped chunk drops its final item",
        ops("norm", "reduce", "elementwise", "loss"),
    ),
    Mutant(
        "K2",
        NORM,
        "for (int64_t j = 0; j < l.n; ++j) mx = std::fmax(mx, static_cast<double>(Load(xp + base + j * st)));",
        "mx = 0;",
        "softmax without max-subtraction",
        ops("norm"),
    ),
    Mutant(
        "K3",
        LOSS,
        "S mx = -INFINITY;\n"
        "                    // A compare, not std::fmax (a libm call per element here); NaN is skipped either way.\n"
        "#pragma omp simd reduction(max : mx)\n"
        "                    for (int64_t j = 0; j < vocab; ++j) {\n"
        "                        S v = Load(row + j);\n"
        "                        mx = v > mx ? v : mx;\n"
        "                    }\n",
        "S mx = 0;\n",
        "cross-entropy's log-sum-exp without max-subtraction",
        ops("loss"),
    ),
    Mutant(
        "K4",
        NORM,
        "var = c ? var / c : 0.0;",
        "var = c > 1 ? var / (c - 1) : 0.0;",
        "layernorm/rmsnorm divide the variance by C - 1",
        ops("norm"),
    ),
    Mutant(
        "K5",
        NORM,
        "double rstd = 1.0 / std::sqrt(var + eps);",
        "double rstd = 1.0 / std::sqrt(var);",
        "layernorm/rmsnorm ignore eps",
        ops("norm"),
    ),
    Mutant(
        "K6",
        NORM,
        "t < omp_get_max_threads(); ++t) s += buf_",
        "t < 1; ++t) s += buf_",
        "norm backward sums only thread 0's dweight/dbias partials",
        ops("norm"),
    ),
    Mutant(
        "K7",
        NORM,
        "double mean_d = kRms ? 0.0 : sum_d / c,",
        "double mean_d = 0.0,",
        "layernorm backward drops the mean(dxhat) term",
        ops("norm"),
    ),
    Mutant(
        "K8",
        ATTN,
        "ProbsRow(P + t * d.S, causal ? t + 1 : d.S, d.S, lh[t]);",
        "ProbsRow(P + t * d.S, d.S, d.S, lh[t]);",
        "sdpa backward ignores the causal mask",
        ops("attention"),
    ),
    Mutant(
        "K9",
        ATTN,
        "C* sc = base + worker * per;",
        "C* sc = base;",
        "sdpa forward: threads share one score buffer",
        ops("attention"),
    ),
    Mutant(
        "K10",
        ATTN,
        "double sign = ctx.i(0) ? -1.0 : 1.0;",
        "double sign = 1.0;",
        "rope ignores inverse",
        ops("attention"),
    ),
    Mutant(
        "K11",
        ATTN,
        "kvh = b * d.Hkv + h / group;",
        "kvh = b * d.Hkv + h % d.Hkv;",
        "grouped-query attention: query heads interleaved over kv heads instead of blocked",
        ops("attention"),
    ),
    Mutant(
        "K12",
        "infinitrain/kernels/cpu/blas.h",
        "i1 = std::min(m, i0 + rows)",
        "i1 = std::min(m - 1, i0 + rows)",
        "Gemm's block grid drops the last row of a clipped final block row",
        ops("gemm", "attention"),
    ),
    Mutant(
        "K13",
        GEMM,
        "bool fold = !ta && Numel(b_batch) == 1",
        "bool fold = Numel(b_batch) == 1",
        "matmul folds the batch into rows even when a is transposed",
        ops("gemm"),
    ),
    Mutant(
        "K14", GEMM, "b + bo[i] * k * n", "b + ao[i] * k * n", "batched matmul reads b at a's batch offset", ops("gemm")
    ),
    Mutant(
        "K15",
        REDUCE,
        "for (int64_t p = 1; p < pieces; ++p)",
        "for (int64_t p = 1; p < pieces - 1; ++p)",
        "long reductions drop their last piece",
        ops("reduce"),
    ),
    Mutant(
        "K16",
        REDUCE,
        "return (v > a || std::isnan(v)) ? v : a;",
        "return v > a ? v : a;",
        "amax drops NaN",
        ops("reduce"),
    ),
    Mutant(
        "K17",
        REDUCE,
        "double v = LoadD(x + i + j);\n            s[j] += v * v;",
        "double v = LoadD(x + i + j);\n            s[j] += static_cast<float>(v * v);",
        "sum_squares rounds each square to float32",
        ops("reduce"),
    ),
    Mutant(
        "K18",
        REDUCE,
        "if (reduce[i]) count *= x.shape()[i];",
        "count *= x.shape()[i];",
        "mean divides by every element, not the reduced ones",
        ops("reduce"),
    ),
    Mutant(
        "K19",
        LOSS,
        "double coef = count ? grad / count : 0.0;",
        "double coef = n ? grad / n : 0.0;",
        "cross-entropy backward divides by all rows, ignored ones included",
        ops("loss"),
    ),
    Mutant(
        "K20",
        LOSS,
        "for (double p : partial) total += p;",
        "total = partial[0];",
        "cross-entropy loss keeps only thread 0's partial sum",
        ops("loss"),
    ),
    Mutant(
        "K21",
        "infinitrain/kernels/cpu/optim.cc",
        "std::sqrt(vi / c.bc2)",
        "std::sqrt(vi)",
        "AdamW without the second moment's bias correction",
        ("tests/ops/test_ops_optim.py", "tests/core/test_nn_optim.py"),
    ),
    Mutant(
        "K22",
        "infinitrain/kernels/cpu/index.cc",
        "p < start[v + 1]; ++p) {",
        "p < start[v + 1] - 1; ++p) {",
        "embedding backward drops each row's last occurrence",
        ops("index"),
    ),
    Mutant(
        "K23",
        "infinitrain/kernels/cpu/attention.cc",
        'RunKernelOf("permute", ctx, {x}, out, {std::vector<int64_t>{0, 2, 1, 3}});',
        'RunKernelOf("permute", ctx, {x}, out, {std::vector<int64_t>{0, 1, 2, 3}});',
        "sdpa_bthd's layout swap copies in place of swapping the head and sequence dims",
        ops("attention"),
    ),
    Mutant(
        "K25",
        "infinitrain/kernels/cpu/blas.h",
        "j1 = std::min(n, j0 + cols)",
        "j1 = std::min(n - 1, j0 + cols)",
        "Gemm's block grid drops the last column of a clipped final block column",
        ops("gemm", "attention"),
    ),
    Mutant(
        "K26",
        "infinitrain/composed_kernels.h",
        'if (ctx.i(0)) RunKernelOf("sum", ctx, {g2}',
        'if (ctx.i(0) && g2.numel() < 0) RunKernelOf("sum", ctx, {g2}',
        "linear_weight_grad leaves dbias unwritten",
        ops("gemm") + ("tests/core/test_autograd.py",),
    ),
    Mutant(
        "K27",
        NORM,
        "Store(sr + j, static_cast<double>(Load(xr + j)) + Load(ar + j));",
        "Store(sr + j, static_cast<double>(Load(xr + j)));",
        "add_layernorm / add_rmsnorm leave y out of the sum",
        ops("norm"),
    ),
    Mutant(
        "K28",
        NORM,
        "Store(dxp + r * c + j, v + Load(rr + j));",
        "Store(dxp + r * c + j, v);",
        "the norms' backward drops the residual gradient",
        ops("norm") + ("tests/core/test_autograd.py",),
    ),
    Mutant(
        "K24",
        "infinitrain/kernels/cpu/common.h",
        "std::min(n, b + chunk)",
        "std::min(n - 1, b + chunk)",
        "foreach ops (ForeachPieces) leave out every tensor's last element",
        ("tests/ops/test_ops_optim.py",),
    ),
]
