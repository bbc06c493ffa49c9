"""Adding a model is one file and one registry line: this file defines a family the framework has never seen
(a ReLU-squared MLP, no position embedding, no rotary tables) with its tensor-parallel plan, registers it, and
trains it through the train CLI on one device, on two tensor-parallel ranks and on two pipeline stages under the
launcher; the split runs follow the one-device loss curve. Run as a script it registers the family and is the
train CLI (`python test_model_family.py --model=toy ...`)."""

import json
import os
from dataclasses import dataclass

import numpy as np
import pytest

from infinitrain import functional as F
from infinitrain import nn
from infinitrain.models import registry
from infinitrain.models.family import Dims, Family, Preset, TensorParallelPlan
from infinitrain.parallel.layers import ColumnParallelLinear, RowParallelLinear, Spec, TPModule


@dataclass
class ToyConfig:
    block_size: int = 64
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


class Attention(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False, device=device)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False, device=device)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head) for t in self.c_attn(x).split(C, dim=2))
        return self.c_proj(F.attention_bthd(q, k, v, is_causal=True).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        self.up = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False, device=device)
        self.down = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False, device=device)

    def forward(self, x):
        h = F.relu(self.up(x))
        return self.down(h * h)


class Block(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        self.ln_1 = nn.RMSNorm(cfg.n_embd, device=device)
        self.attn = Attention(cfg, device)
        self.ln_2 = nn.RMSNorm(cfg.n_embd, device=device)
        self.mlp = MLP(cfg, device)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Toy(nn.Module):
    def __init__(self, cfg, device="cpu"):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd, device=device)
        self.h = nn.ModuleList([Block(cfg, device) for _ in range(cfg.n_layer)])
        self.ln_f = nn.RMSNorm(cfg.n_embd, device=device)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False, device=device)

    def forward(self, idx, targets=None):
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class AttentionTP(TPModule):
    """This rank's heads: its rows of q, k and v in c_attn, its columns of c_proj."""

    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        C = cfg.n_embd
        self.region, self.heads, self.hs = region, cfg.n_head // tp, C // cfg.n_head
        qkv, proj = Spec(full.c_attn.weight.shape, 0, [(C, tp)] * 3), Spec(full.c_proj.weight.shape, 1, [(C, tp)])
        self.c_attn = ColumnParallelLinear(qkv.take(full.c_attn.weight, tp, r), None, region, enter=False)
        self.c_proj = RowParallelLinear(proj.take(full.c_proj.weight, tp, r), None, region)
        self._specs = {"c_attn.weight": qkv, "c_proj.weight": proj}

    def forward(self, x):
        x = self.region.enter(x)
        B, T, _ = x.shape
        w = self.heads * self.hs
        q, k, v = (t.reshape(B, T, self.heads, self.hs) for t in self.c_attn(x).split(w, dim=2))
        return self.c_proj(F.attention_bthd(q, k, v, is_causal=True).reshape(B, T, w))


class MLPTP(TPModule):
    def __init__(self, full, cfg, region):
        super().__init__()
        tp, r = region.size, region.rank
        H = 4 * cfg.n_embd
        up, down = Spec(full.up.weight.shape, 0, [(H, tp)]), Spec(full.down.weight.shape, 1, [(H, tp)])
        self.region = region
        self.up = ColumnParallelLinear(up.take(full.up.weight, tp, r), None, region, enter=False)
        self.down = RowParallelLinear(down.take(full.down.weight, tp, r), None, region)
        self._specs = {"up.weight": up, "down.weight": down}

    def forward(self, x):
        h = F.relu(self.up(self.region.enter(x)))
        return self.down(h * h)


FAMILY = Family(
    "toy",
    Toy,
    ToyConfig,
    custom={"n_layer": 2, "n_head": 2, "n_embd": 32},
    presets=(Preset("toy", "a test-only family (ReLU-squared MLP)"),),
    shape_flags=("n_layer", "n_head", "n_embd"),
    lora_targets="attn.c_attn",
    tensor_parallel=TensorParallelPlan(
        "wte",
        "h",
        "ln_f",
        "attn",
        "mlp",
        AttentionTP,
        MLPTP,
        lambda c: Dims(c.n_head, c.n_head, c.n_layer, 4 * c.n_embd, c.vocab_size),
    ),  # fmt: skip
)


# ---- the tests ----

FLAGS = ["--model=toy", "--n_layer=2", "--n_embd=32", "--n_head=2", "--vocab_size=64", "--sequence_length=16"]
FLAGS += ["--batch_size=2", "--total_batch_size=128", "--num_iteration=5", "--learning_rate=3e-3"]
FLAGS += ["--lr_warmup_iters=1", "--val_loss_every=0", "--freq_generate_txt=0"]


def _train(run_train, tmp_path, name, n, *flags):
    metrics = tmp_path / f"{name}.jsonl"
    p = run_train(*FLAGS, *flags, f"--metrics_file={metrics}", nproc=n, cwd=tmp_path, program=os.path.abspath(__file__))
    with open(metrics) as f:
        records = [json.loads(line) for line in f]
    return records[0], [r["train_loss"] for r in records if r["kind"] == "step"], p.stdout


@pytest.fixture
def tokens(tmp_path):
    from infinitrain.data import write_tokens

    path = tmp_path / "train.bin"
    write_tokens(path, np.tile(np.random.default_rng().integers(0, 64, 53), 200).astype(np.uint16))
    return str(path)


def test_a_new_family_trains_from_the_cli_on_one_device_and_split(run_train, tmp_path, tokens):
    config, one, out = _train(run_train, tmp_path, "one", 1, f"--input_bin={tokens}", f"--save={tmp_path / 'ckpt'}")
    assert config["family"] == "toy" and config["model_config"]["n_embd"] == 32 and "model toy (toy)" in out
    assert len(one) == 5 and all(np.isfinite(one)) and one[-1] < one[0]
    for name, flags, layout in (("tp2", ["--tensor_parallel=2"], (2, 1)), ("pp2", ["--pipeline_parallel=2"], (1, 2))):
        config, split, _ = _train(run_train, tmp_path, name, 2, f"--input_bin={tokens}", *flags)
        assert (config["layout"]["tp"], config["layout"]["pp"]) == layout
        np.testing.assert_allclose(split, one, rtol=0, atol=2e-5, err_msg=name)


def test_registering_checks_names_and_unregisters():
    assert "toy" not in registry.FAMILIES  # this process has not registered it
    registry.register(FAMILY)
    try:
        assert registry.family_of("toy") is FAMILY and "toy: a test-only family" in "\n".join(registry.describe())
        with pytest.raises(ValueError, match="already registered"):
            registry.register(FAMILY)
        spec = registry.resolve("toy", shape={"n_layer": 3}, sequence_length=16, vocab_size=64)
        model = spec.build("cpu")
        assert isinstance(model, Toy) and len(model.h) == 3 and model.config.block_size == 16
        assert registry.family_of_model(model) is FAMILY
        with pytest.raises(registry.ModelChoiceError, match="--n_kv_head does not apply to toy models"):
            registry.resolve("toy", shape={"n_kv_head": 1}, sequence_length=16, vocab_size=64)
    finally:
        registry.unregister("toy")
    assert "toy" not in registry.PRESETS


if __name__ == "__main__":
    from infinitrain import train

    registry.register(FAMILY)
    train.run()
