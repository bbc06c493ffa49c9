"""Qwen3 (dense) and Qwen3-MoE: grouped-query attention with a per-head RMSNorm on queries and keys
(QK-norm) before rotary embeddings (theta 1e6), SwiGLU MLPs, and an optionally tied output head. With
num_experts > 0 the layers that Qwen3-MoE's rule picks (decoder_sparse_step, mlp_only_layers) use the
sparse mixture-of-experts block Mixtral uses. Sizes default to Qwen3-0.6B's."""

from dataclasses import dataclass

from infinitrain.models.decoder import DecoderLM, check_config


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
