"""Mixtral: the LLaMA-style decoder (grouped-query attention, rotary embeddings with theta 1e6, RMSNorm)
whose every feed-forward block is a sparse mixture of SwiGLU experts, top-2 of 8 by default, with dropless
dispatch and the router's load-balancing loss (router_aux_loss_coef). Sizes default to Mixtral 8x7B's."""

from dataclasses import dataclass

from infinitrain.models.decoder import DecoderLM, check_config


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


class Mixtral(DecoderLM):
    qk_norm = False
