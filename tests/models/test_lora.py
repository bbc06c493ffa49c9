"""LoRA: adapted layers compute x W^T + scale * x A^T B^T (NumPy reference), merged weights give the same
logits, base weights stay frozen and out of the optimizer, adapters save and reload alone, and the CLI
helpers (models/registry.py) pick targets and trainable parameters."""

import json

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, assert_close, rng
from infinitrain import nn
from infinitrain.models import (
    GPT2,
    GPT2Config,
    LLaMA3,
    LLaMA3Config,
    Mixtral,
    MixtralConfig,
    Qwen3,
    Qwen3Config,
    lora,
    registry,
)

V, T = 41, 8


def qwen3(tie=False, seed=0):
    it.manual_seed(seed)
    cfg = Qwen3Config(T, V, 2, 4, 2, 24, head_dim=8, intermediate_size=40, tie_word_embeddings=tie)
    return Qwen3(cfg, DEVICE)


def batch(g):
    d = g.integers(0, V, (2, T + 1))
    return it.from_numpy(d[:, :-1], device=DEVICE), it.from_numpy(d[:, 1:], device=DEVICE)


def randomize_adapters(model, g):
    for _, m in lora.lora_modules(model):
        m.lora_B.copy_(it.from_numpy(g.standard_normal(m.lora_B.shape) * 0.1, device=DEVICE))


def test_adapted_linear_against_numpy():
    g = rng()
    base = nn.Linear(6, 5, True, DEVICE)
    base.bias.copy_(it.from_numpy(g.standard_normal(5), device=DEVICE))
    layer = lora.LoRALinear(base, rank=3, alpha=6.0)
    assert layer.scaling == 2.0
    np.testing.assert_array_equal(layer.lora_B.numpy(), 0.0)  # a fresh adapter changes nothing
    assert np.abs(layer.lora_A.numpy()).max() <= 1 / np.sqrt(6)
    layer.lora_B.copy_(it.from_numpy(g.standard_normal((5, 3)), device=DEVICE))
    x = g.standard_normal((4, 6))
    w, b, a, bb = (p.numpy().astype(np.float64) for p in (layer.weight, layer.bias, layer.lora_A, layer.lora_B))
    want = x @ w.T + b + 2.0 * (x @ a.T) @ bb.T
    assert_close(layer(it.from_numpy(x, "float32", DEVICE)), want, "float32")


def test_merged_logits_equal_base_plus_adapter():
    g = rng()
    model = qwen3()
    lora.apply_lora(model, ["q_proj", "layers.1.mlp.down_proj", "lm_head"], rank=4, alpha=8.0)
    randomize_adapters(model, g)
    x, _ = batch(g)
    unmerged = model(x)[0].numpy()
    # Reference: a plain model whose weights are W + scale * B @ A, computed in NumPy.
    plain = qwen3()
    own = dict(model.named_parameters())
    for name, p in plain.named_parameters():
        w = own[name].numpy().astype(np.float64)
        layer = name[: -len(".weight")]
        if layer + ".lora_A" in own:
            w = w + 2.0 * own[layer + ".lora_B"].numpy() @ own[layer + ".lora_A"].numpy()
        p.copy_(it.from_numpy(w, device=DEVICE))
    want = plain(x)[0].numpy()
    np.testing.assert_allclose(unmerged, want, rtol=1e-5, atol=1e-5)
    lora.merge_lora(model)
    np.testing.assert_allclose(model(x)[0].numpy(), want, rtol=1e-5, atol=1e-5)
    lora.unmerge_lora(model)
    np.testing.assert_allclose(model(x)[0].numpy(), unmerged, rtol=1e-5, atol=1e-5)


def test_base_weights_frozen_and_out_of_the_optimizer():
    g = rng()
    model = qwen3()
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    adapted = lora.apply_lora(model, "q_proj,v_proj", rank=2, alpha=4.0, dropout=0.1)
    assert adapted == [f"layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")]
    params = lora.trainable_parameters(model)
    assert len(params) == 2 * len(adapted) and all(p.requires_grad for p in params)
    opt = it.optim.AdamW(params, lr=1e-2)
    # Optimizer state only for the adapters: 2 moments x (r*in + out*r) per layer.
    # q_proj: A [2, 24], B [32, 2]; v_proj: A [2, 24], B [16, 2]; two layers.
    assert sum(p.numel() for p in params) == 2 * (48 + 64 + 48 + 32)
    state = sum(t.numel() for t in opt._state_tensors_live().values())
    assert state == 2 * sum(p.numel() for p in params)
    x, y = batch(g)
    for _ in range(3):
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
    after = model.state_dict()
    for k, v in before.items():
        np.testing.assert_array_equal(after[k].numpy(), v, err_msg=k)  # frozen weights unchanged
        assert after[k].grad is None, k
    assert any(np.abs(p.numpy()).max() > 0 for p in params[1::2]), "the B matrices moved"


def test_adapters_save_and_reload_alone(tmp_path):
    g = rng()
    model = qwen3(seed=5)
    lora.apply_lora(model, "o_proj,gate_proj", rank=3, alpha=3.0)
    randomize_adapters(model, g)
    x, _ = batch(g)
    logits = model(x)[0].numpy()
    lora.save_adapters(model, tmp_path)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    assert cfg["r"] == 3 and cfg["lora_alpha"] == 3.0 and cfg["target_modules"] == ["o_proj", "gate_proj"]
    from infinitrain.models import hf

    names = set(hf.read_file(str(tmp_path / "adapter_model.safetensors")))
    assert names == set(lora.adapter_state_dict(model)) and all(".lora_" in n for n in names)
    fresh = qwen3(seed=5)  # the same base weights
    lora.load_adapters(fresh, tmp_path)
    np.testing.assert_array_equal(fresh(x)[0].numpy(), logits)
    other = qwen3(seed=5)
    lora.apply_lora(other, "q_proj", rank=3, alpha=3.0)
    with pytest.raises(ValueError, match="adapters do not fit"):
        lora.load_adapters(other, tmp_path)


def test_merge_and_unload_then_save_pretrained(tmp_path):
    g = rng()
    model = qwen3()
    lora.apply_lora(model, "k_proj,up_proj", rank=2, alpha=2.0)
    randomize_adapters(model, g)
    x, _ = batch(g)
    with pytest.raises(ValueError, match="merge_and_unload"):
        model.save_pretrained(tmp_path)
    want = model(x)[0].numpy()
    lora.merge_and_unload(model)
    assert not lora.lora_modules(model) and all(p.requires_grad for p in model.parameters())
    model.save_pretrained(tmp_path)
    np.testing.assert_allclose(Qwen3.from_pretrained(tmp_path, DEVICE)(x)[0].numpy(), want, rtol=1e-5, atol=1e-5)


def test_target_module_errors_and_patterns():
    model = qwen3()
    with pytest.raises(ValueError, match=r"\['attn'\] match no linear layer"):
        lora.apply_lora(model, "q_proj,attn")
    with pytest.raises(ValueError, match="target_modules is empty"):
        lora.apply_lora(model, " , ")
    assert lora.apply_lora(model, "layers.1.*_proj") == [
        f"layers.1.{m}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    ]  # fmt: skip
    with pytest.raises(ValueError, match="already has LoRA"):
        lora.apply_lora(model, "q_proj")
    with pytest.raises(ValueError, match="lora rank"):
        lora.apply_lora(qwen3(), "q_proj", rank=0)
    q = qwen3().layers[0].self_attn.q_proj
    side = min(q.in_features, q.out_features)
    assert lora.LoRALinear(q, side, 1.0).lora_A.shape == (side, q.in_features)  # the largest rank that adds
    with pytest.raises(ValueError, match=f"lora rank {side + 1} exceeds the smaller side"):
        lora.LoRALinear(q, side + 1, 1.0)


@pytest.mark.parametrize("name", ["gpt2", "llama3", "mixtral", "qwen3"])
def test_registry_lora_defaults_cover_each_model(name):
    model = registry.build_model(name, V, T, n_layer=1, n_head=2, n_embd=16, n_kv_head=1, num_experts=2, device=DEVICE)
    cls = {"gpt2": GPT2, "llama3": LLaMA3, "mixtral": Mixtral, "qwen3": Qwen3}[name]
    assert isinstance(model, cls)
    every = registry.setup_lora(model, name, 0)
    assert len(every) == len(list(model.parameters()))
    params = registry.setup_lora(model, name, rank=2, alpha=4.0)
    assert 0 < len(params) < len(every) and all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    x = it.from_numpy(rng().integers(0, V, (1, T)), device=DEVICE)
    _, loss = model(x, x)
    loss.backward()
    assert all(p.grad is not None for p in params)


def test_registry_builds_from_config_json_and_init_from(tmp_path):
    m = registry.build_model("mixtral", V, T, n_layer=1, n_head=2, n_embd=16, num_experts=3, num_experts_per_tok=1)
    assert isinstance(m.config, MixtralConfig) and m.config.num_experts == 3 and m.config.num_experts_per_tok == 1
    m.save_pretrained(tmp_path / "mx")
    cfg = registry.build_model("mixtral", V, T, config_json=str(tmp_path / "mx" / "config.json")).config
    assert cfg == m.config
    loaded = registry.build_model("mixtral", V, T, init_from=str(tmp_path / "mx"), device=DEVICE)
    for (n, a), (_, b) in zip(m.named_parameters(), loaded.named_parameters(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=n)
    with pytest.raises(ValueError, match="holds a mixtral checkpoint, but --model=qwen3"):
        registry.build_model("qwen3", V, T, init_from=str(tmp_path / "mx"))
    with pytest.raises(ValueError, match="describes a mixtral model, but --model=llama3"):
        registry.build_model("llama3", V, T, config_json=str(tmp_path / "mx" / "config.json"))
    with pytest.raises(ValueError, match="smaller than the data's"):
        registry.build_model("mixtral", V + 1, T, init_from=str(tmp_path / "mx"))
    g = GPT2(GPT2Config(T, V, 64, 1, 2, 16))
    g.save_llmc(tmp_path / "g.bin")
    assert isinstance(registry.build_model("gpt2", V, T, init_from=str(tmp_path / "g.bin")), GPT2)
    with pytest.raises(ValueError, match="llm.c model files hold gpt2 or llama3"):
        registry.build_model("qwen3", V, T, init_from=str(tmp_path / "g.bin"))
    with pytest.raises(ValueError, match="--model must be one of"):
        registry.build_model("bert", V, T)
    ll = registry.build_model("llama3", V, T, n_layer=1, n_head=2, n_embd=16, intermediate_size=40)
    assert isinstance(ll.config, LLaMA3Config) and ll.config.hidden_dim == 40


def test_config_drives_the_helpers_and_checkpoints_resume(tmp_path):
    """What the trainer does with the helpers: settings -> model -> LoRA -> steps -> checkpoint -> resume."""
    from infinitrain import checkpoint
    from infinitrain.training import RunConfig
    from infinitrain.training.strategy import fill_missing_grads
    from infinitrain.training.trainer import RUN_FLAGS

    assert set(registry.FLAG_SPECS) <= set(RUN_FLAGS)  # every model setting is checked on resume
    cfg = RunConfig(model="mixtral", num_experts=4, lora_rank=2, lora_target_modules="q_proj,experts.*")
    sizes = {"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 16, "num_experts": cfg.num_experts}

    def setup():
        it.manual_seed(1)
        model = registry.build_model(cfg.model, V, T, **sizes, device=DEVICE)
        params = registry.setup_lora(model, cfg.model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules)
        return model, params, it.optim.AdamW(params, lr=1e-2)

    model, params, opt = setup()
    assert all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    g = rng()
    x, y = batch(g)
    for _ in range(2):
        opt.zero_grad()
        model(x, y)[1].backward()
        fill_missing_grads(params)
        assert all(p.grad is not None for p in params)
        opt.step()
    tensors = {f"model.{k}": v.numpy() for k, v in model.state_dict().items()}
    tensors.update({f"optim.{k}": v for k, v in opt.state_dict()["tensors"].items()})
    checkpoint.save(tmp_path / "ckpt.bin", tensors, {})
    again, _, opt2 = setup()
    loaded, _ = checkpoint.load(tmp_path / "ckpt.bin")
    again.load_state_dict({k[6:]: v for k, v in loaded.items() if k.startswith("model.")})
    opt2.load_state_dict({"step": 2, "lr": 1e-2, "tensors": {k[6:]: v for k, v in loaded.items() if k[:6] == "optim."}})
    np.testing.assert_array_equal(again(x)[0].numpy(), model(x)[0].numpy())


@pytest.mark.parametrize("autocast", [False, True])
def test_activation_recompute_replays_the_lora_dropout(autocast):
    """Recompute in backward draws the same dropout masks as the forward: loss, gradients and the generator's
    state afterwards equal a run without recompute (same seed), bit for bit."""
    from infinitrain.nn import recompute

    g = rng()
    x, y = batch(g)
    B = [g.standard_normal((n, 2)) * 0.5 for n in (32, 16)]  # q_proj, v_proj out widths

    def step(with_recompute):
        model = qwen3(seed=3)
        lora.apply_lora(model, "q_proj,v_proj", rank=2, alpha=4.0, dropout=0.5)
        for (_, m), b in zip(lora.lora_modules(model), B * 2, strict=True):
            m.lora_B.copy_(it.from_numpy(b, device=DEVICE))
        if with_recompute:
            recompute.enable(model, list(model.layers))
        it.manual_seed(11)
        with it.amp.autocast(DEVICE, dtype="bfloat16", enabled=autocast):
            _, loss = model(x, y)
        loss.backward()
        grads = {n: p.grad.numpy() for n, p in model.named_parameters() if p.requires_grad}
        return loss.item(), grads, it.random.default_generator.get_state()

    loss, grads, state = step(False)
    loss_rc, grads_rc, state_rc = step(True)
    assert loss_rc == loss and state_rc == state
    assert sorted(grads_rc) == sorted(grads) and len(grads) == 8
    for k in grads:
        np.testing.assert_array_equal(grads_rc[k], grads[k], err_msg=k)
