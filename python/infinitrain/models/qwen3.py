"""Qwen3 (dense) and Qwen3-MoE: grouped-query attention with a per-head RMSNorm on queries and keys
(QK-norm) before rotary embeddings (theta 1e6), SwiGLU MLPs, and an optionally tied output head. With
num_experts > 0 the layers that Qwen3-MoE's rule picks (decoder_sparse_step, mlp_only_layers) use the
sparse mixture-of-experts block Mixtral uses. Sizes default to Qwen3-0.6B's."""

from dataclasses import dataclass

from infinitrain.models import decoder, hf
from infinitrain.models.decoder import DecoderLM, check_config
from infinitrain.models.family import Family, HFFormat, Preset
from infinitrain.models.llama3 import hf_decoder_checks


@dataclass
class Qwen3Config:
    block_size: int = 40960
    vocab_size: int = 151936
    n_layer: int = 28
    n_head: int = 16
    n_kv_head: int = 8
    n_embd: int = 1024
    head_dim: int = 128  # Qwen3 sets it apart from n_embd / n_head
    intermediate_size: int = 3072
    norm_eps: float = 1e-6
    rope_theta: float = 1e6
    tie_word_embeddings: bool = True
    # Qwen3-MoE (num_experts = 0: dense)
    num_experts: int = 0
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple = ()
    router_aux_loss_coef: float = 0.001

    use_scaled_rope = False  # not a field: plain rotary frequencies

    def __post_init__(self):
        self.mlp_only_layers = tuple(int(i) for i in self.mlp_only_layers)
        check_config(self)


class Qwen3(DecoderLM):
    qk_norm = True


# ---- Hugging Face checkpoints (model_type qwen3, or qwen3_moe with experts) ----


def config_from_hf(cfg):
    hidden, heads, kv = hf_decoder_checks(cfg, "Qwen3")
    hf.require(cfg, "rope_scaling", (None,), None, "Qwen3 uses plain rotary frequencies")
    hf.require(cfg, "use_sliding_window", (False,), False, "Qwen3 attends over the whole causal context")
    kw = {}
    if cfg.get("model_type") == "qwen3_moe":
        layers = cfg.get("mlp_only_layers") or []
        if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ValueError(
                f"{hf.where(cfg)}: field 'mlp_only_layers' must be a list of layer numbers, got {layers!r}"
            )
        kw = dict(
            num_experts=hf.field(cfg, "num_experts"),
            num_experts_per_tok=hf.field(cfg, "num_experts_per_tok"),
            moe_intermediate_size=hf.field(cfg, "moe_intermediate_size"),
            norm_topk_prob=hf.field(cfg, "norm_topk_prob", False, bool),
            decoder_sparse_step=hf.field(cfg, "decoder_sparse_step", 1),
            mlp_only_layers=tuple(layers),
            router_aux_loss_coef=hf.coefficient(cfg, "router_aux_loss_coef", 0.001),
        )
    return hf.build(
        lambda: Qwen3Config(
            block_size=hf.field(cfg, "max_position_embeddings"),
            vocab_size=hf.field(cfg, "vocab_size"),
            n_layer=hf.field(cfg, "num_hidden_layers"),
            n_head=heads,
            n_kv_head=kv,
            n_embd=hidden,
            head_dim=hf.field(cfg, "head_dim", 128),
            intermediate_size=hf.field(cfg, "intermediate_size"),
            norm_eps=hf.field(cfg, "rms_norm_eps", 1e-6, float),
            rope_theta=hf.field(cfg, "rope_theta", 10000.0, float),
            tie_word_embeddings=hf.field(cfg, "tie_word_embeddings", True, bool),
            **kw,
        ),
        "the Qwen3 config",
        cfg,
    )


def save_hf(model):
    c = model.config
    cfg = decoder.hf_config_fields(c)
    if c.num_experts:
        cfg.update(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            num_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            moe_intermediate_size=c.moe_intermediate_size,
            norm_topk_prob=c.norm_topk_prob,
            decoder_sparse_step=c.decoder_sparse_step,
            mlp_only_layers=list(c.mlp_only_layers),
            router_aux_loss_coef=c.router_aux_loss_coef,
            output_router_logits=False,
            use_sliding_window=False,
            sliding_window=None,
        )
    else:
        cfg.update(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", use_sliding_window=False, sliding_window=None
        )
    return cfg, decoder.save_hf_tensors(model)


FAMILY = Family(
    "qwen3",
    Qwen3,
    Qwen3Config,
    custom={"n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 128},
    presets=(Preset("qwen3", "a small qwen3 (4 layers, 4 heads, 2 kv heads, 128 wide; sizes by flags)"),),
    make_config=lambda f: decoder.config_from_sizes(Qwen3Config, f, tie_word_embeddings=False),
    vocab_of_kind={"llama3": 128256},
    blocks="layers",
    recompute_ok=lambda config: not config.num_experts,
    lora_targets="q_proj,k_proj,v_proj,o_proj",
    hf=HFFormat(("qwen3", "qwen3_moe"), config_from_hf, decoder.load_hf, save_hf, shapes=decoder.hf_shapes(Qwen3)),
)
Qwen3.family = FAMILY
