"""Every train CLI flag tested by its effect. Runs start from llm.c model files written by tests/numpy_models.py,
so the initial weights are known; checkpoints give the weights and AdamW state after a step; the printed numbers
are compared with float64 NumPy references or with AdamW's formula."""

import math
import os
import re
import struct

import numpy as np
import pytest

import harness
import numpy_models as ref
from harness import DEVICE, rng
from infinitrain.data import DataLoader
from infinitrain.runs import read_checkpoint

V, C, NH, L, MAXT = 61, 32, 4, 2, 16
T, B = 8, 4
BETA1 = 0.9  # the CLI's AdamW betas are (0.9, 0.95)


def run_train(*flags, check=True):
    return harness.run_train("--sample_every=0", *flags, check=check)


def steps(stdout):
    """step -> (loss, lr, norm) as printed."""
    out = {s: tuple(float(v) for v in line) for s, line in harness.step_lines(stdout).items()}
    return out


def gpt2_forward(params):
    return lambda x: ref.gpt2_forward(params, x, NH, V)


@pytest.fixture
def model_file(tmp_path):
    """A GPT-2 llm.c file with known float32 weights: (path, params)."""
    params = ref.to_f32(
        ref.gpt2_random_params(rng(), vocab_size=V, padded_vocab_size=64, block_size=MAXT, n_layer=L, n_embd=C)
    )
    path = tmp_path / "model.bin"
    path.write_bytes(ref.gpt2_llmc_bytes(params, block_size=MAXT, vocab_size=V, n_layer=L, n_head=NH, n_embd=C))
    return str(path), params


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "train.bin"
    path.write_bytes(ref.tokens_bytes(rng().integers(0, V, size=1201)))
    return str(path)


def base(model_path, tokens_path, ckpt=None, **kw):
    flags = {"llmc_filepath": model_path, "input_bin": tokens_path, "sequence_length": T, "batch_size": B}
    flags.update(num_iteration=1, warmup_steps=0, learning_rate=0.01, weight_decay=0.0, grad_clip=0.0, seed=5)
    if ckpt is not None:
        flags["checkpoint_dir"] = ckpt
    flags.update(kw)
    return [f"--{k}={v}" for k, v in flags.items()]


def ckpt_tensors(ckpt, step):
    tensors, meta = read_checkpoint(os.path.join(ckpt, f"ckpt_{step:08d}.bin"))
    assert meta["step"] == step
    return tensors


def model_tensors(tensors):
    return {k[len("model.") :]: v.astype(np.float64) for k, v in tensors.items() if k.startswith("model.")}


def first_batch(tokens_path, batch=B, seed=5):
    return next(DataLoader(tokens_path, batch, T, shuffle=True, seed=seed))


def assert_printed(printed, want, decimals, what):
    # Printed with `decimals` digits: off by at most half a unit there, plus float32's own error.
    assert abs(printed - want) <= 0.5 * 10**-decimals + 2e-6 * abs(want) + 1e-6, (what, printed, want)


def test_llmc_filepath_starts_from_those_weights(model_file, tokens, tmp_path):
    path, params = model_file
    ckpt = str(tmp_path / "ckpt")
    out = run_train(*base(path, tokens, ckpt, learning_rate=0.0)).stdout
    x, y = first_batch(tokens)
    loss, _, _ = steps(out)[1]
    assert_printed(loss, ref.mean_cross_entropy(gpt2_forward(params)(x), y), 6, "step-1 loss")
    # lr 0: the checkpoint holds the file's weights exactly.
    got = model_tensors(ckpt_tensors(ckpt, 1))
    np.testing.assert_array_equal(got["wte.weight"], params["wte"])
    np.testing.assert_array_equal(got["h.1.attn.c_attn.bias"], params["layers"][1]["qkv_b"])
    np.testing.assert_array_equal(got["ln_f.weight"], params["lnf_w"])


def test_llama3_llmc_filepath(tokens, tmp_path):
    c = dict(block_size=MAXT, vocab_size=V, n_layer=1, n_head=4, n_kv_head=2, n_embd=C, ffn_dim_multiplier=1.0)
    c.update(multiple_of=16, norm_eps=1e-5, rope_theta=1e4, use_scaled_rope=False)
    hidden = ref.llama3_hidden_dim(C, 1.0, 16)
    gen = rng()
    params = ref.to_f32(
        ref.llama3_random_params(gen, vocab_size=V, n_layer=1, n_head=4, n_kv_head=2, n_embd=C, hidden_dim=hidden)
    )
    path = tmp_path / "llama.bin"
    path.write_bytes(ref.llama3_llmc_bytes(params, c, "llmc"))
    out = run_train(*base(str(path), tokens, learning_rate=0.0), "--model=llama3").stdout
    x, y = first_batch(tokens)
    assert_printed(steps(out)[1][0], ref.mean_cross_entropy(ref.llama3_forward(params, x, c), y), 6, "llama3 loss")


def test_weight_decay_follows_adamw(model_file, tokens, tmp_path):
    """AdamW's decoupled decay: p1 = p0 - lr * (wd * p0 + adam_update); the update is the same with and without
    decay in the first step, so the two runs differ by exactly -lr * wd * p0 in every parameter."""
    path, params = model_file
    lr, wd = 0.01, 3.0
    run_train(*base(path, tokens, str(tmp_path / "a"), learning_rate=lr, weight_decay=0.0))
    run_train(*base(path, tokens, str(tmp_path / "b"), learning_rate=lr, weight_decay=wd))
    plain, decayed = (model_tensors(ckpt_tensors(str(tmp_path / d), 1)) for d in "ab")
    start = {
        "wte.weight": params["wte"],
        "ln_f.bias": params["lnf_b"],
        "h.0.mlp.c_fc.weight": params["layers"][0]["fc_w"],
    }
    start["h.1.ln_2.weight"] = params["layers"][1]["ln2_w"]
    for name, p0 in start.items():
        np.testing.assert_allclose(decayed[name] - plain[name], -lr * wd * p0, rtol=1e-4, atol=1e-6, err_msg=name)


def test_grad_clip_bounds_the_applied_gradient(model_file, tokens, tmp_path):
    """The printed norm is the norm before clipping; AdamW's first moment after one step is (1 - beta1) times the
    gradient it was given, so its norm shows the clipped gradient: min(norm, clip)."""
    path, _ = model_file
    runs = {}
    for clip in (0.0, 1e9, 0.05):
        d = str(tmp_path / f"c{clip}")
        out = run_train(*base(path, tokens, d, grad_clip=clip)).stdout
        m = [v for k, v in ckpt_tensors(d, 1).items() if k.startswith("optim.m.")]
        applied = math.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in m)) / (1 - BETA1)
        runs[clip] = (steps(out)[1][2], applied)
    norm = runs[0.0][0]
    assert norm > 0.2  # well above the clip below
    for clip, (printed, applied) in runs.items():
        assert printed == norm, runs  # the same first gradient in every run
        want = norm if clip in (0.0, 1e9) else clip * norm / (norm + 1e-6)
        assert abs(applied - want) <= 1e-5 * want + 5e-5, (clip, applied, want)


def periodic_tokens(tmp_path, period):
    """Tokens repeating with the given period: every window of T tokens starting at a multiple of T is one of
    period / T fixed rows, so batches of any size hold the same rows in the same proportions."""
    phrase = rng().integers(0, V, size=period)
    path = tmp_path / f"periodic{period}.bin"
    path.write_bytes(ref.tokens_bytes(np.tile(phrase, 2400 // period + 1)))
    return str(path)


def test_gradient_accumulation_equals_the_large_batch(model_file, tmp_path):
    """Two micro-batches of 2 rows accumulate the gradient of the mean loss over 4 rows: the same printed loss and
    norm, and the same first moment in AdamW (0.1 times the gradient; the weights themselves are a poor witness:
    Adam's first step moves each by about lr whatever the gradient's size)."""
    path, params = model_file
    data = periodic_tokens(tmp_path, 2 * T)  # rows alternate A, B: a 4-row batch is A B A B, a 2-row one A B
    big = run_train(*base(path, data, str(tmp_path / "big"), batch_size=4, grad_clip=1.0)).stdout
    acc = run_train(*base(path, data, str(tmp_path / "acc"), batch_size=2, total_batch_size=4 * T, grad_clip=1.0))
    assert "accumulation 1" in big and "accumulation 2" in acc.stdout
    (loss, _, norm), (loss2, _, norm2) = steps(big)[1], steps(acc.stdout)[1]
    x, y = first_batch(data)
    assert_printed(loss, ref.mean_cross_entropy(gpt2_forward(params)(x), y), 6, "step-1 loss")
    assert abs(loss2 - loss) <= 2e-6, (loss, loss2)  # the mean loss, not the sum over micro-batches
    assert abs(norm2 - norm) <= 1e-4 + 1e-5 * norm, (norm, norm2)  # the gradient of the mean
    ma, mb = (ckpt_tensors(str(tmp_path / d), 1) for d in ("big", "acc"))
    for name in (k for k in ma if k.startswith("optim.m.")):
        # Sums over rows in another order: float32 rounding at the scale of the largest terms, not of each result
        # (an element that nearly cancels differs by ~1e-8 where the tensor reaches ~1e-3).
        scale = float(np.abs(ma[name]).max())
        np.testing.assert_allclose(mb[name], ma[name], rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def test_learning_rate_and_warmup_schedule(model_file, tokens):
    """Printed lr: InfiniTrain's linear warmup from 0 (step 1's rate is 0) to --learning_rate over --warmup_steps,
    then a cosine down to a tenth of it."""
    path, _ = model_file
    lr, warmup, n = 0.004, 3, 8
    out = steps(run_train(*base(path, tokens, learning_rate=lr, warmup_steps=warmup, num_iteration=n)).stdout)
    for s in range(n):
        if s < warmup:
            want = lr * s / warmup
        else:
            want = 0.1 * lr + 0.5 * (1 + math.cos(math.pi * (s - warmup) / (n - warmup))) * 0.9 * lr
        assert abs(out[s + 1][1] - want) <= 0.006 * want, (s, out[s + 1][1], want)  # printed to 3 digits


@pytest.mark.parametrize("eot", [17, None])
def test_sampling_uses_the_tokenizer_and_the_model(model_file, tokens, tmp_path, eot):
    """A sample at step 1 is the tokenizer's decoding of tokens drawn (top-k 40, temperature 1, seeded with --seed)
    from the model's distribution after step 1, starting from the end-of-text token, or from token 0 when the
    tokenizer has none (a version-1 file of another vocabulary than GPT-2's)."""
    import infinitrain as it
    from infinitrain.models import GPT2

    path, _ = model_file
    pieces = [f"<{i}>".encode() for i in range(V)]
    raw = bytearray(ref.tokenizer_bytes(pieces, 0 if eot is None else eot))
    if eot is None:
        struct.pack_into("<i", raw, 4, 1)  # header word 1: version 1, which has no end-of-text id
    tok = tmp_path / "tok.bin"
    tok.write_bytes(bytes(raw))
    ckpt = str(tmp_path / "ckpt")
    out = run_train(*base(path, tokens, ckpt), f"--tokenizer_bin={tok}", "--sample_every=1", "--sample_length=6").stdout
    m = re.search(r"--- sample at step 1 ---\n(.*)\n---", out)
    assert m, out
    sampled = [int(t) for t in re.findall(r"<(\d+)>", m.group(1))]
    assert "".join(f"<{t}>" for t in sampled) == m.group(1) and len(sampled) == 6
    # The same draw from the step-1 weights.
    model = GPT2.from_llmc(path, DEVICE)
    model.load_state_dict(model_tensors(ckpt_tensors(ckpt, 1)))
    draw = np.random.default_rng(5)
    seq = [0 if eot is None else eot]
    for _ in range(6):
        logits = model(it.from_numpy(np.array([seq]), device=DEVICE))[0].numpy()[0, -1].astype(np.float64)
        kth = np.sort(logits)[-40]
        logits = np.where(logits < kth, -np.inf, logits)
        p = np.exp(logits - logits.max())
        seq.append(int(draw.choice(V, p=p / p.sum())))
    assert sampled == seq[1:]


def test_log_file_gets_the_header_and_step_lines(model_file, tokens, tmp_path):
    path, _ = model_file
    log = tmp_path / "train.log"
    out = run_train(*base(path, tokens, num_iteration=3), f"--log_file={log}").stdout
    printed = [line for line in out.splitlines() if line.startswith(("model ", "step "))]
    assert len(printed) == 4 and log.read_text().splitlines() == printed
    again = run_train(*base(path, tokens, num_iteration=2), f"--log_file={log}").stdout
    printed += [line for line in again.splitlines() if line.startswith(("model ", "step "))]
    assert log.read_text().splitlines() == printed  # appended


def test_validation_loss_is_the_mean_over_val_batches(model_file, tokens, tmp_path):
    path, _ = model_file
    val = tmp_path / "val.bin"
    val_tokens = rng().integers(0, V, size=5 * B * T + 1)
    val.write_bytes(ref.tokens_bytes(val_tokens))
    ckpt = str(tmp_path / "ckpt")
    flags = base(path, tokens, ckpt, num_iteration=3, checkpoint_every=1, keep_checkpoints=3)
    out = run_train(*flags, f"--input_val_bin={val}", "--val_every=2", "--val_batches=2").stdout
    printed = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+) \| val loss (\S+)$", out, re.M)}
    assert sorted(printed) == [2, 3]  # every 2 steps, and at the end
    for s, loss in printed.items():
        params = gpt2_params(model_tensors(ckpt_tensors(ckpt, s)))
        chunks = val_tokens[: 2 * B * T + 1]  # the first two batches, in file order
        want = np.mean(
            [
                ref.mean_cross_entropy(
                    gpt2_forward(params)(chunks[j : j + B * T].reshape(B, T)),
                    chunks[j + 1 : j + B * T + 1].reshape(B, T),
                )
                for j in (0, B * T)
            ]
        )
        assert_printed(loss, want, 6, f"val loss at step {s}")


GPT2_NAMES = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight")
GPT2_NAMES += ("attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias")
GPT2_NAMES += ("mlp.c_proj.weight", "mlp.c_proj.bias")


def gpt2_params(w):
    """The NumPy reference's parameters from a checkpoint's model tensors."""
    params = {"wte": w["wte.weight"], "wpe": w["wpe.weight"], "lnf_w": w["ln_f.weight"], "lnf_b": w["ln_f.bias"]}
    params["layers"] = [
        {k: w[f"h.{i}.{n}"] for k, n in zip(ref.GPT2_LAYER_KEYS, GPT2_NAMES, strict=True)} for i in range(L)
    ]
    return params


def test_dtype_bfloat16_autocasts(model_file, tokens):
    path, params = model_file
    f32 = steps(run_train(*base(path, tokens, num_iteration=2)).stdout)
    out = run_train(*base(path, tokens, num_iteration=2, dtype="bfloat16")).stdout
    assert "dtype bfloat16" in out
    bf = steps(out)
    x, y = first_batch(tokens)
    want = ref.mean_cross_entropy(gpt2_forward(params)(x), y)
    assert_printed(f32[1][0], want, 6, "float32 loss")
    # bfloat16 matmuls: off by bfloat16 rounding (rtol 1.6e-2), but not float32's result.
    assert abs(bf[1][0] - want) <= 1.6e-2 * want and bf[1][0] != f32[1][0], (bf, f32, want)


def test_fresh_model_flags_shape_the_model(tokens, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    flags = ["--model=llama3", f"--input_bin={tokens}", "--sequence_length=8", "--batch_size=2", "--num_iteration=1"]
    shape = ["--n_layer=3", "--n_head=4", "--n_kv_head=1", "--n_embd=48", "--vocab_size=64"]
    run_train(*flags, *shape, f"--checkpoint_dir={ckpt}")
    w = model_tensors(ckpt_tensors(ckpt, 1))
    assert sorted({k.split(".")[1] for k in w if k.startswith("h.")}) == ["0", "1", "2"]
    assert w["h.0.attn.c_attn.weight"].shape == ((4 + 2 * 1) * 12, 48)  # 4 query heads, 1 kv head, head dim 12
    assert int(np.fromfile(tokens, dtype="<u2", offset=1024).max()) < 64  # the declared vocabulary covers the data
    assert w["wte.weight"].shape == (64, 48)


def test_seed_sets_initialisation_and_data_order(tokens):
    flags = [f"--input_bin={tokens}", "--sequence_length=8", "--batch_size=2", "--num_iteration=2", "--n_layer=1"]
    flags += ["--n_embd=32", "--n_head=2"]
    a, b = (steps(run_train(*flags, f"--seed={s}").stdout) for s in (1, 2))
    assert a[1] != b[1] and a[2] != b[2]  # (that one seed repeats a run bit for bit: test_models, test_train)


# ---- where the model comes from -------------------------------------------------------------------------------


def model_loss(model, tokens_path):
    """The model's loss on the CLI's first batch."""
    import infinitrain as it

    x, y = first_batch(tokens_path)
    with it.no_grad():
        return model(it.from_numpy(x, device=DEVICE), it.from_numpy(y, device=DEVICE))[1].item()


def hf_flags(tokens_path, ckpt=None, **kw):
    flags = {"input_bin": tokens_path, "sequence_length": T, "batch_size": B, "num_iteration": 1, "seed": 5}
    flags.update(warmup_steps=0, learning_rate=0.01, grad_clip=0.0)
    if ckpt is not None:
        flags["checkpoint_dir"] = ckpt
    flags.update(kw)
    return [f"--{k}={v}" for k, v in flags.items()]


def test_init_from_a_hugging_face_folder_starts_from_its_weights(tokens, tmp_path):
    """--init_from a folder save_pretrained wrote: the step-1 loss is that model's on the first batch, and with
    lr 0 the checkpoint holds the folder's weights."""
    import infinitrain as it
    from infinitrain.models import Qwen3, Qwen3Config

    cfg = Qwen3Config(MAXT, V, 2, 4, 2, 24, head_dim=8, intermediate_size=40, tie_word_embeddings=True)
    model = Qwen3(cfg, DEVICE)
    g = rng()
    for p in model.parameters():  # far from a fresh init, so a fresh model's loss could not pass for it
        p.copy_(it.from_numpy(g.standard_normal(p.shape) * 0.3, device=DEVICE))
    folder = tmp_path / "qwen3"
    model.save_pretrained(folder)
    ckpt = str(tmp_path / "ckpt")
    out = run_train(*hf_flags(tokens, ckpt, model="qwen3", init_from=folder, learning_rate=0.0)).stdout
    loaded = Qwen3.from_pretrained(folder, DEVICE)
    assert_printed(steps(out)[1][0], model_loss(loaded, tokens), 6, "step-1 loss")
    got = model_tensors(ckpt_tensors(ckpt, 1))
    for name, p in loaded.state_dict().items():
        np.testing.assert_array_equal(got[name], p.numpy(), err_msg=name)


@pytest.mark.parametrize("kind", ["qwen3", "llama_tied"])
def test_config_json_sizes_a_fresh_model(kind, tokens, tmp_path):
    """--config_json: a fresh model of the config's shape (initialised from --seed as any fresh model), so the
    step-1 loss is that of the same model built from the same config and seed; a tied LLaMA config gives a
    tied head (its parameters counted once)."""
    import json

    import infinitrain as it
    from infinitrain.models import registry
    from infinitrain.runs import read_metrics

    base = dict(vocab_size=V, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=MAXT, rms_norm_eps=1e-6, hidden_act="silu")  # fmt: skip
    if kind == "qwen3":
        cfg, name = dict(base, model_type="qwen3", head_dim=8, rope_theta=1e6, tie_word_embeddings=False), "qwen3"
    else:
        cfg, name = dict(base, model_type="llama", rope_theta=5e5, tie_word_embeddings=True), "llama3"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    metrics = tmp_path / "m.jsonl"
    out = run_train(*hf_flags(tokens, model=name, config_json=path), f"--metrics_file={metrics}").stdout
    it.manual_seed(5)
    model = registry.build_model(name, V, T, config_json=str(path), device=DEVICE)
    assert_printed(steps(out)[1][0], model_loss(model, tokens), 6, "step-1 loss")
    config = read_metrics(metrics)[0]
    assert config["parameters"] == model.num_parameters()
    assert (config["model_config"]["n_layer"], config["model_config"]["n_embd"]) == (2, 24)
    if kind == "llama_tied":
        assert model.lm_head.weight is model.wte.weight
        untied = registry.build_model(name, V, T, n_layer=2, n_head=4, n_kv_head=2, n_embd=24, intermediate_size=40)
        assert config["parameters"] == untied.num_parameters() - V * 24


def test_save_optimizer_state_false_leaves_the_optimizer_out(model_file, tokens, tmp_path):
    """The checkpoint holds no optimizer tensors; continuing from it says the optimizer starts fresh, and the
    continued step equals one from a full checkpoint loaded with --load_optimizer_state=false (and differs from
    the uninterrupted run's, whose AdamW moments carry over)."""
    path, _ = model_file
    runs = {}
    for name, save_opt in (("without", "false"), ("with", "true")):
        d = str(tmp_path / name)
        run_train(*base(path, tokens, d, num_iteration=2, checkpoint_every=1), f"--save_optimizer_state={save_opt}")
        tensors, meta = read_checkpoint(os.path.join(d, "ckpt_00000001.bin"))
        runs[name] = (tensors, meta)
    tensors, meta = runs["without"]
    assert not [k for k in tensors if k.startswith("optim.")] and meta["optimizer"]["saved"] is False
    assert [k for k in runs["with"][0] if k.startswith("optim.")]
    cont = {}
    for name, extra in (("without", []), ("with", ["--load_optimizer_state=false"])):
        d = str(tmp_path / f"{name}_cont")
        first = os.path.join(str(tmp_path / name), "ckpt_00000001.bin")
        p = run_train(*base(path, tokens, d, num_iteration=2), f"--load={first}", *extra)
        why = "holds no optimizer state (--save_optimizer_state=false)" if name == "without" else extra[0]
        assert f"note: the optimizer starts fresh: the checkpoint {why}" in p.stderr, p.stderr
        assert "at step 1" in p.stdout
        cont[name] = (steps(p.stdout)[2], model_tensors(ckpt_tensors(d, 2)))
    assert cont["without"][0] == cont["with"][0]
    straight = model_tensors(ckpt_tensors(str(tmp_path / "with"), 2))
    for k, v in cont["with"][1].items():
        np.testing.assert_array_equal(cont["without"][1][k], v, err_msg=k)
    assert any(not np.array_equal(straight[k], v) for k, v in cont["with"][1].items())


def test_router_aux_loss_coef_weighs_the_balancing_loss(tokens, tmp_path):
    """Mixtral's training loss is cross-entropy + coef * load-balancing loss: the printed step-1 loss for each
    --router_aux_loss_coef (default: Mixtral's 0.02) against the model's two terms on the first batch."""
    import infinitrain as it
    from infinitrain.models import registry as R
    from infinitrain.runs import read_metrics

    shape = {"n_layer": 1, "n_head": 2, "n_embd": 16, "num_experts": 4, "num_experts_per_tok": 2}
    shape["intermediate_size"] = 24
    flags = hf_flags(tokens, model="mixtral", vocab_size=V, **shape)
    it.manual_seed(5)
    model = R.resolve("mixtral", shape=shape, sequence_length=T, vocab_size=V, router_aux_loss_coef=0.0).build(DEVICE)
    ce = model_loss(model, tokens)
    aux = model.aux_loss.item()
    assert aux > 0.5  # a term the coefficients below move the loss by well beyond the printed digits
    for coef in (None, 0.0, 0.5):
        metrics = tmp_path / f"m{coef}.jsonl"
        extra = [] if coef is None else [f"--router_aux_loss_coef={coef}"]
        out = run_train(*flags, *extra, f"--metrics_file={metrics}").stdout
        want = ce + (0.02 if coef is None else coef) * aux
        assert_printed(steps(out)[1][0], want, 6, f"loss with coef {coef}")
        assert read_metrics(metrics)[0]["model_config"]["router_aux_loss_coef"] == (0.02 if coef is None else coef)
    for model_flags in (["--model=gpt2"], ["--model=qwen3"]):
        p = run_train(*hf_flags(tokens, vocab_size=V), *model_flags, "--router_aux_loss_coef=0.1", check=False)
        assert p.returncode == 2 and "--router_aux_loss_coef applies to mixture-of-experts models" in p.stderr, p.stderr


def schedule_lrs(model_path, tokens_path, tmp_path, n, **kw):
    """step -> lr of an n-step run, as its metrics record (unrounded)."""
    from infinitrain.runs import read_metrics

    metrics = tmp_path / "m.jsonl"
    run_train(*base(model_path, tokens_path, num_iteration=n, **kw), f"--metrics_file={metrics}")
    return {s: r["lr"] for s, r in read_metrics(metrics)[1].items()}


def test_lr_warmup_init_starts_the_warmup_there(model_file, tokens, tmp_path):
    """The warmup climbs linearly from --lr_warmup_init (not 0) to --learning_rate: 0.001, 0.00175, 0.0025, 0.00325."""
    lrs = schedule_lrs(model_file[0], tokens, tmp_path, 4, learning_rate=0.004, warmup_steps=4, lr_warmup_init=0.001)
    assert lrs == {s: pytest.approx(0.001 + 0.003 * (s - 1) / 4, rel=1e-6) for s in range(1, 5)}


def test_lr_decay_style_linear_decays_in_a_straight_line(model_file, tokens, tmp_path):
    """--lr_decay_style=linear: from --learning_rate down to a tenth of it in equal steps (not a cosine)."""
    lrs = schedule_lrs(model_file[0], tokens, tmp_path, 4, learning_rate=0.004, lr_decay_style="linear")
    assert lrs == {s: pytest.approx(0.004 - 0.0036 * (s - 1) / 4, rel=1e-6) for s in range(1, 5)}


def test_min_lr_is_where_the_cosine_ends(model_file, tokens, tmp_path):
    """The cosine decays to --min_lr (not --learning_rate / 10): min + (lr - min) * (1 + cos(pi * s / 4)) / 2."""
    lrs = schedule_lrs(model_file[0], tokens, tmp_path, 4, learning_rate=0.004, min_lr=0.002)
    want = {s: 0.002 + 0.002 * (1 + math.cos(math.pi * (s - 1) / 4)) / 2 for s in range(1, 5)}
    assert lrs == {s: pytest.approx(v, rel=1e-6) for s, v in want.items()}


def test_optimizer_picks_the_update_rule(model_file, tokens, tmp_path):
    """After one step, Adam's second moment over the squared first is (1 - 0.999) / (1 - 0.9)^2 = 0.1, AdamW's
    (1 - 0.95) / 0.01 = 5; SGD keeps no state and moves each weight by -lr * g (g: AdamW's first moment / 0.1)."""
    path, _ = model_file
    lr, state = 0.01, {}
    for opt in ("adamw", "adam", "sgd"):
        d = str(tmp_path / opt)
        run_train(*base(path, tokens, d, learning_rate=lr, optimizer=opt))
        state[opt] = ckpt_tensors(d, 1)
    for opt, ratio in (("adamw", 5.0), ("adam", 0.1)):
        t = state[opt]
        m = {k[len("optim.m.") :]: v.astype(np.float64) for k, v in t.items() if k.startswith("optim.m.")}
        assert len(m) == 28, sorted(t)
        for name, mk in m.items():
            vk = t[f"optim.v.{name}"].astype(np.float64)
            big = np.abs(mk) > 1e-4  # where float32 keeps the ratio's digits
            np.testing.assert_allclose(vk[big] / mk[big] ** 2, ratio, rtol=1e-3, err_msg=f"{opt} {name}")
    assert not [k for k in state["sgd"] if k.startswith("optim.")]
    params = model_file[1]
    start = {"wte.weight": params["wte"], "ln_f.bias": params["lnf_b"]}
    start["h.0.mlp.c_fc.weight"] = params["layers"][0]["fc_w"]
    sgd = model_tensors(state["sgd"])
    order = list(sgd)  # the optimizer's state is indexed by parameter, in the model's order
    for name, p0 in start.items():
        g = state["adamw"][f"optim.m.{order.index(name)}"].astype(np.float64) / (1 - BETA1)
        np.testing.assert_allclose(sgd[name] - p0, -lr * g, rtol=1e-4, atol=1e-7, err_msg=name)


def test_max_checkpoint_keep_deletes_the_older_checkpoints(model_file, tokens, tmp_path):
    """Saving every step of 5 with --max_checkpoint_keep=3 leaves the newest three (steps 3, 4, 5)."""
    ckpt = tmp_path / "ckpt"
    run_train(*base(model_file[0], tokens, str(ckpt), num_iteration=5, checkpoint_every=1, max_checkpoint_keep=3))
    assert sorted(p.name for p in ckpt.glob("ckpt_*")) == [f"ckpt_{s:08d}.bin" for s in (3, 4, 5)]


# ---- LoRA -------------------------------------------------------------------------------------------------------

LORA_TARGETS = [f"h.{i}.attn.{n}" for i in range(L) for n in ("c_attn", "c_proj")]  # GPT-2's default targets
LORA_RANK = 2


def lora_step(model_path, tokens_path, d, **kw):
    """One SGD step with rank-2 adapters on the default targets, validated on the first B x T tokens of a val file
    after it: (printed step-1 loss, recorded val loss, the checkpoint's model tensors, the val batch)."""
    from infinitrain.runs import read_metrics

    val_tokens = rng().integers(0, V, size=B * T + 1)
    val = d + ".val.bin"
    with open(val, "wb") as f:
        f.write(ref.tokens_bytes(val_tokens))
    flags = base(model_path, tokens_path, d, optimizer="sgd", lora_rank=LORA_RANK, **kw)
    out = run_train(*flags, f"--input_val_bin={val}", "--val_every=1", "--val_batches=1").stdout
    val_loss = read_metrics(os.path.join(d, "metrics.jsonl"))[1][1]["val_loss"]
    batch = (val_tokens[:-1].reshape(B, T), val_tokens[1:].reshape(B, T))
    return steps(out)[1][0], val_loss, model_tensors(ckpt_tensors(d, 1)), batch


def merged_loss(w, alpha, batch):
    """The reference's loss with every adapter merged into its weight: W + (alpha / r) B A."""
    w = dict(w)
    for n in LORA_TARGETS:
        w[f"{n}.weight"] = w[f"{n}.weight"] + alpha / LORA_RANK * w[f"{n}.lora_B"] @ w[f"{n}.lora_A"]
    return ref.mean_cross_entropy(gpt2_forward(gpt2_params(w))(batch[0]), batch[1])


def test_lora_alpha_scales_the_update_by_alpha_over_rank(model_file, tokens, tmp_path):
    """y = x W^T + (alpha / r) x A^T B^T with B = 0 at the start: the first step leaves A alone (its gradient has a
    factor B) and gives B the gradient (alpha / r) G A^T, G the base weight's gradient, which a full fine-tuning
    run's AdamW first moment holds (0.1 G). With SGD, B1 = -lr (alpha / r) G A^T; the validation after the step
    sees the merged weights W + (alpha / r) B1 A."""
    path, _ = model_file
    lr = 1.0  # B's first step from 0 is exact at any rate; a large one moves the val loss well past float rounding
    full = str(tmp_path / "full")
    full_loss = steps(run_train(*base(path, tokens, full)).stdout)[1][0]
    state = ckpt_tensors(full, 1)
    order = list(model_tensors(state))  # the optimizer's state is indexed by parameter, in the model's order
    grad = {n: state[f"optim.m.{order.index(f'{n}.weight')}"].astype(np.float64) / (1 - BETA1) for n in LORA_TARGETS}
    for alpha in (1.0, 6.0):
        d = str(tmp_path / f"alpha{alpha}")
        loss, val_loss, w, batch = lora_step(path, tokens, d, learning_rate=lr, lora_alpha=alpha)
        assert loss == full_loss  # a fresh adapter leaves the model as it was, whatever alpha
        for n in LORA_TARGETS:
            want = -lr * alpha / LORA_RANK * grad[n] @ w[f"{n}.lora_A"].T
            np.testing.assert_allclose(w[f"{n}.lora_B"], want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=n)
        assert abs(val_loss - merged_loss(w, alpha, batch)) <= 1e-5, (alpha, val_loss)


def lora_b(w):
    return np.concatenate([w[f"{n}.lora_B"].ravel() for n in LORA_TARGETS])


def test_lora_dropout_drops_the_adapters_input_in_training(model_file, tokens, tmp_path):
    """Dropout on the adapter's input: B's first gradient (alpha / r) G_y^T dropout(X) A^T (G_y: the layer output's
    gradient) leaves the no-dropout one by a relative amount that grows as sqrt(p / (1 - p)) (inverted dropout
    keeps the mean): about 3 times as much at p = 0.5 as at p = 0.1. The first step's loss is untouched (B = 0:
    the adapter adds nothing yet)."""
    path, _ = model_file
    runs = {p: lora_step(path, tokens, str(tmp_path / f"p{p}"), lora_dropout=p) for p in (0.0, 0.1, 0.5)}
    assert len({loss for loss, *_ in runs.values()}) == 1
    b0 = lora_b(runs[0.0][2])
    dev = {p: np.linalg.norm(lora_b(runs[p][2]) - b0) / np.linalg.norm(b0) for p in (0.1, 0.5)}
    # (with --seed 1 to 5: dev[0.1] 0.3 to 0.4, the ratio 2.2 to 3.4)
    assert dev[0.1] > 0.1 and 1.5 * dev[0.1] < dev[0.5] < 6 * dev[0.1], dev


def test_lora_dropout_leaves_the_validation_alone(model_file, tokens, tmp_path):
    """Evaluation drops nothing: the val loss after a step with --lora_dropout=0.5 is the merged weights' loss."""
    _, val_loss, w, batch = lora_step(model_file[0], tokens, str(tmp_path / "p"), learning_rate=1.0, lora_dropout=0.5)
    assert abs(val_loss - merged_loss(w, 16.0, batch)) <= 1e-5, val_loss
