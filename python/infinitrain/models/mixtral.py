"""Mixtral: the LLaMA-style decoder (grouped-query attention, rotary embeddings with theta 1e6, RMSNorm)
whose every feed-forward block is a sparse mixture of SwiGLU experts, top-2 of 8 by default, with dropless
dispatch and the router's load-balancing loss (router_aux_loss_coef). Sizes default to Mixtral 8x7B's."""

import re
from dataclasses import dataclass

from infinitrain.models import decoder, hf
from infinitrain.models.decoder import DecoderLM, check_config
from infinitrain.models.family import Dims, Family, HFFormat, Preset, TensorParallelPlan
from infinitrain.models.llama3 import hf_decoder_checks, rope_tables
from infinitrain.models.moe import ExpertParallelMoE, load_balancing_loss
from infinitrain.parallel.layout import LayoutError


@dataclass
class MixtralConfig:
    block_size: int = 32768
    vocab_size: int = 32000
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int = 8
    n_embd: int = 4096
    intermediate_size: int = 14336  # each expert's SwiGLU width
    num_experts: int = 8
    num_experts_per_tok: int = 2
    norm_eps: float = 1e-5
    rope_theta: float = 1e6
    router_aux_loss_coef: float = 0.02
    head_dim: int = 0  # 0: n_embd // n_head
    tie_word_embeddings: bool = False

    # Not fields: Mixtral renormalises the top-k gates and puts experts in every layer.
    use_scaled_rope = False
    norm_topk_prob = True
    decoder_sparse_step = 1
    mlp_only_layers = ()

    def __post_init__(self):
        if self.n_head < 1:
            raise ValueError(f"n_head must be positive, got {self.n_head}")
        if not self.head_dim:
            if self.n_embd % self.n_head:
                raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
            self.head_dim = self.n_embd // self.n_head
        if self.num_experts < 1:
            raise ValueError(f"num_experts must be positive, got {self.num_experts}")
        check_config(self)

    @property
    def moe_intermediate_size(self):
        return self.intermediate_size


_EXPERT_NAMES = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}


class Mixtral(DecoderLM):
    qk_norm = False

    @staticmethod
    def hf_rename(name):
        name = name.replace(".mlp.", ".block_sparse_moe.")
        return re.sub(r"(experts\.\d+\.)(gate_proj|down_proj|up_proj)", lambda m: m[1] + _EXPERT_NAMES[m[2]], name)


# ---- Hugging Face checkpoints ----


def config_from_hf(cfg):
    hidden, heads, kv = hf_decoder_checks(cfg, "Mixtral")
    hf.require(cfg, "rope_scaling", (None,), None, "Mixtral uses plain rotary frequencies")
    hf.require(cfg, "tie_word_embeddings", (False,), False, "Mixtral has an untied lm_head")
    block = hf.field(cfg, "max_position_embeddings")
    window = cfg.get("sliding_window")
    if window is not None and (not isinstance(window, int) or window < block):
        raise ValueError(
            f"{hf.where(cfg)}: field 'sliding_window' = {window!r} cannot be represented: Mixtral here attends over "
            f"the whole causal context (null, or at least max_position_embeddings = {block})"
        )
    jitter = cfg.get("router_jitter_noise", 0.0) or 0.0
    if jitter != 0:
        raise ValueError(
            f"{hf.where(cfg)}: field 'router_jitter_noise' = {jitter!r} cannot be represented: no router noise"
        )
    return hf.build(
        lambda: MixtralConfig(
            block_size=block,
            vocab_size=hf.field(cfg, "vocab_size"),
            n_layer=hf.field(cfg, "num_hidden_layers"),
            n_head=heads,
            n_kv_head=kv,
            n_embd=hidden,
            head_dim=hf.field(cfg, "head_dim", 0 if hidden % heads else hidden // heads),
            intermediate_size=hf.field(cfg, "intermediate_size"),
            num_experts=hf.field(cfg, "num_local_experts"),
            num_experts_per_tok=hf.field(cfg, "num_experts_per_tok"),
            norm_eps=hf.field(cfg, "rms_norm_eps", 1e-5, float),
            rope_theta=hf.field(cfg, "rope_theta", 1e6, float),
            router_aux_loss_coef=hf.coefficient(cfg, "router_aux_loss_coef", 0.02),
        ),
        "the Mixtral config",
        cfg,
    )


def save_hf(model):
    c = model.config
    cfg = decoder.hf_config_fields(c)
    cfg.update(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=c.num_experts,
        num_experts_per_tok=c.num_experts_per_tok,
        router_aux_loss_coef=c.router_aux_loss_coef,
        router_jitter_noise=0.0,
        output_router_logits=False,
        sliding_window=None,
    )
    return cfg, decoder.save_hf_tensors(model)


# ---- tensor parallelism: attention heads split, whole experts to each rank (expert parallel) ----


def _dims(cfg):
    if cfg.tie_word_embeddings:
        raise LayoutError("tensor and pipeline parallelism for Mixtral need an untied output head")
    return Dims(cfg.n_head, cfg.n_kv_head, cfg.n_layer, None, cfg.vocab_size, experts=cfg.num_experts)


def _make_config(f):
    return decoder.config_from_sizes(
        MixtralConfig, f, num_experts=f.get("num_experts", 8), num_experts_per_tok=f.get("num_experts_per_tok", 2)
    )


FAMILY = Family(
    "mixtral",
    Mixtral,
    MixtralConfig,
    custom={"n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 128, "num_experts": 8, "num_experts_per_tok": 2},
    presets=(Preset("mixtral", "a small mixtral (4 layers, 4 heads, 2 kv heads, 128 wide; sizes by flags)"),),
    shape_flags=("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size", "num_experts", "num_experts_per_tok"),
    make_config=_make_config,
    vocab_of_kind={"llama3": 128256},
    blocks="layers",
    recompute_ok=lambda config: not config.num_experts,
    lora_targets="q_proj,k_proj,v_proj,o_proj",
    hf=HFFormat(("mixtral",), config_from_hf, decoder.load_hf, save_hf, shapes=decoder.hf_shapes(Mixtral)),
    tensor_parallel=TensorParallelPlan(
        "embed_tokens",
        "layers",
        "norm",
        "self_attn",
        "mlp",
        decoder.AttentionTP,
        ExpertParallelMoE,
        _dims,
        rotary=lambda c, d, n: rope_tables(c, d, n),
        balancing_loss=load_balancing_loss,
    ),  # fmt: skip
)
Mixtral.family = FAMILY
