"""Tiny, randomly initialised MoE causal LMs of real architectures, built offline.

``tiny_moe(arch)`` returns a ``transformers`` model of the same class as the full-size checkpoints
with the project tokenizer's vocabulary, so that every code path except size (routing, fused expert
weights, checkpoint names, KV cache, chat template) runs on a CPU:

* ``glm4_moe`` (GLM-4.5 / 4.6 / Air), ``qwen3_moe``, ``mixtral``: grouped-query attention;
* ``glm4_moe_lite`` (GLM-4.7-Flash): DeepSeek-style multi-head latent attention (MLA). vLLM's CPU
  MLA kernel needs ``kv_lora_rank + qk_rope_head_dim == 576`` (DeepSeek's 512 + 64), the default here;
* ``glm_moe_dsa`` (GLM-5 class): MLA plus DeepSeek sparse attention's lightning indexer; its
  ``index_head_dim`` must exceed ``qk_rope_head_dim`` (the indexer splits its heads into a rotary
  and a plain part). vLLM's CPU backend does not run it (sparse attention is GPU-only).

Nothing is downloaded: the model comes from a config and a seeded random init.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from compactrl.tokenizer import ENDOFTEXT_ID, IM_END_ID

ARCHS = ("glm4_moe", "qwen3_moe", "mixtral", "glm4_moe_lite", "glm_moe_dsa")
MLA_ARCHS = ("glm4_moe_lite", "glm_moe_dsa")
"""Architectures with multi-head latent attention (``head_dim`` and key/value heads do not apply)."""


@dataclass(frozen=True)
class TinyMoEConfig:
    """Size and routing knobs of a tiny MoE model (defaults measured for CPU RL, see docs)."""

    arch: str = "glm4_moe"
    """Architecture: one of ``ARCHS`` (``transformers`` model_type)."""
    vocab_size: int | None = None
    """Vocabulary size; None means the project tokenizer's."""
    hidden_size: int = 128
    """Residual stream width."""
    num_layers: int = 2
    """Decoder layers (for glm4_moe the first ``first_k_dense`` of them are dense)."""
    num_experts: int = 4
    """Routed experts per MoE layer."""
    experts_per_token: int = 2
    """Experts each token is routed to (top-k)."""
    moe_intermediate_size: int = 128
    """Hidden width of each expert's SwiGLU."""
    intermediate_size: int = 256
    """Hidden width of dense MLPs (glm4_moe's dense layers; mixtral uses ``moe_intermediate_size``)."""
    num_attention_heads: int = 4
    """Query heads."""
    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    head_dim: int = 32
    """Per-head width."""
    max_position_embeddings: int = 8192
    """Longest context the rotary embedding is configured for."""
    first_k_dense: int = 1
    """glm4_moe, glm4_moe_lite, glm_moe_dsa: how many leading layers use a dense MLP (GLM-4.5 uses dense
    first layers); at most ``num_layers - 1``, so the last layer is always an MoE layer."""
    n_shared_experts: int = 1
    """glm4_moe only: always-on shared experts."""
    tie_word_embeddings: bool = False
    """Share the input embedding with the LM head."""
    pad_token_id: int = ENDOFTEXT_ID
    """Padding id (the project tokenizer's ``<|endoftext|>``)."""
    eos_token_ids: tuple[int, ...] = (IM_END_ID, ENDOFTEXT_ID)
    """Ids that end generation (``<|im_end|>``, ``<|endoftext|>``), written to the generation config."""
    initializer_range: float = 0.02
    """Std of the random normal init."""
    kv_lora_rank: int = 512
    """MLA only: width of the compressed key/value latent (512 + ``qk_rope_head_dim`` 64 = vLLM CPU's 576)."""
    q_lora_rank: int | None = 64
    """MLA only: width of the compressed query (None: a full-rank query projection)."""
    qk_rope_head_dim: int = 64
    """MLA only: rotary part of each query/key head."""
    qk_nope_head_dim: int = 32
    """MLA only: non-rotary part of each query/key head."""
    v_head_dim: int = 32
    """MLA only: value head width."""
    index_head_dim: int = 128
    """glm_moe_dsa only: head width of the sparse-attention indexer (must exceed ``qk_rope_head_dim``)."""
    index_n_heads: int = 2
    """glm_moe_dsa only: indexer heads."""
    index_topk: int = 2048
    """glm_moe_dsa only: keys each query attends to (>= the context: the tiny model attends densely)."""

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        for name in ("hidden_size", "num_layers", "num_experts", "experts_per_token", "head_dim",
                     "moe_intermediate_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token must be <= num_experts ({self.num_experts}), got {self.experts_per_token}"
            )
        if self.arch in ("glm4_moe", *MLA_ARCHS) and self.num_experts < 2:
            raise ValueError(f"{self.arch} routing scores groups by their top-2 experts: num_experts must be >= 2")
        if self.arch in MLA_ARCHS:
            for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if getattr(self, name) < 1:
                    raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
            if self.qk_rope_head_dim % 2:
                raise ValueError(f"qk_rope_head_dim must be even (rotary pairs), got {self.qk_rope_head_dim}")
            if self.q_lora_rank is not None and self.q_lora_rank < 1:
                raise ValueError(f"q_lora_rank must be >= 1 or None, got {self.q_lora_rank}")
        if self.arch == "glm_moe_dsa" and self.index_head_dim <= self.qk_rope_head_dim:
            raise ValueError(f"index_head_dim must exceed qk_rope_head_dim ({self.qk_rope_head_dim}), "
                             f"got {self.index_head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.max_position_embeddings < 8192:
            raise ValueError(f"max_position_embeddings must be >= 8192, got {self.max_position_embeddings}")
        if self.vocab_size is not None and self.vocab_size < 3:
            raise ValueError(f"vocab_size must be >= 3 (pad, im_start, im_end), got {self.vocab_size}")


def _project_vocab_size() -> int:
    from compactrl.tokenizer import shared_tokenizer

    return len(shared_tokenizer())


def build_config(cfg: TinyMoEConfig):
    """The ``transformers`` config for ``cfg`` (pure: no weights are made)."""
    from transformers import Glm4MoeConfig, MixtralConfig, Qwen3MoeConfig

    if cfg.arch in MLA_ARCHS:
        return _mla_config(cfg)

    vocab = cfg.vocab_size if cfg.vocab_size is not None else _project_vocab_size()
    common: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        pad_token_id=cfg.pad_token_id,
        eos_token_id=list(cfg.eos_token_ids),
        bos_token_id=None,
        initializer_range=cfg.initializer_range,
        num_experts_per_tok=cfg.experts_per_token,
    )
    if cfg.arch == "glm4_moe":
        return Glm4MoeConfig(
            **common,
            intermediate_size=cfg.intermediate_size,
            moe_intermediate_size=cfg.moe_intermediate_size,
            n_routed_experts=cfg.num_experts,
            n_shared_experts=cfg.n_shared_experts,
            first_k_dense_replace=_dense_layers(cfg),
            n_group=1,
            topk_group=1,
            num_nextn_predict_layers=0,  # no multi-token-prediction layer: nothing for vLLM to skip
        )
    if cfg.arch == "qwen3_moe":
        return Qwen3MoeConfig(
            **common,
            intermediate_size=cfg.intermediate_size,
            moe_intermediate_size=cfg.moe_intermediate_size,
            num_experts=cfg.num_experts,
            norm_topk_prob=True,
        )
    return MixtralConfig(
        **common,
        intermediate_size=cfg.moe_intermediate_size,
        num_local_experts=cfg.num_experts,
        sliding_window=None,
        router_jitter_noise=0.0,
    )


def _dense_layers(cfg: TinyMoEConfig) -> int:
    """Leading dense layers: ``first_k_dense``, but the last layer is always an MoE layer (a one-layer
    model is an MoE model; vLLM refuses a glm4_moe checkpoint without an MoE layer)."""
    return max(0, min(cfg.first_k_dense, cfg.num_layers - 1))


def _mla_config(cfg: TinyMoEConfig):
    """GLM-4.7-Flash (``glm4_moe_lite``) or GLM-5-class (``glm_moe_dsa``) config: MLA attention."""
    from transformers import Glm4MoeLiteConfig, GlmMoeDsaConfig

    n_dense = _dense_layers(cfg)
    common: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size if cfg.vocab_size is not None else _project_vocab_size(),
        hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size, moe_intermediate_size=cfg.moe_intermediate_size,
        n_routed_experts=cfg.num_experts, n_shared_experts=cfg.n_shared_experts,
        num_experts_per_tok=cfg.experts_per_token, n_group=1, topk_group=1,
        kv_lora_rank=cfg.kv_lora_rank, q_lora_rank=cfg.q_lora_rank, qk_rope_head_dim=cfg.qk_rope_head_dim,
        qk_nope_head_dim=cfg.qk_nope_head_dim, v_head_dim=cfg.v_head_dim,
        mlp_layer_types=["dense"] * n_dense + ["sparse"] * (cfg.num_layers - n_dense),
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
        pad_token_id=cfg.pad_token_id, eos_token_id=list(cfg.eos_token_ids), bos_token_id=None,
        initializer_range=cfg.initializer_range,
    )
    if cfg.arch == "glm4_moe_lite":
        config = Glm4MoeLiteConfig(**common)
        # transformers < 5.20 (vLLM's) reads the dense layers from first_k_dense_replace, newer ones
        # from mlp_layer_types: config.json carries both, so either side builds the same model
        config.first_k_dense_replace = n_dense
        return config
    return GlmMoeDsaConfig(**common, first_k_dense_replace=n_dense, index_head_dim=cfg.index_head_dim,
                           index_n_heads=cfg.index_n_heads, index_topk=cfg.index_topk,
                           head_dim=cfg.qk_rope_head_dim)


def tiny_moe(
    arch: str = "glm4_moe",
    *,
    vocab_size: int | None = None,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_experts: int = 4,
    experts_per_token: int = 2,
    max_position_embeddings: int = 8192,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    experts_implementation: str = "grouped_mm",
    attn_implementation: str = "sdpa",
    **kwargs: Any,
):
    """A randomly initialised (seeded) MoE causal LM of architecture ``arch``.

    Extra keyword arguments are fields of :class:`TinyMoEConfig` (``moe_intermediate_size``,
    ``head_dim``, ``first_k_dense``, ...). The global RNG is left untouched. Save and load with
    ``model.save_pretrained(dir)`` / ``AutoModelForCausalLM.from_pretrained(dir)``.
    ``experts_implementation="batched_mm"`` is avoided by default: it is 10-100x slower on CPU.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    cfg = TinyMoEConfig(
        arch=arch, vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
        num_experts=num_experts, experts_per_token=experts_per_token,
        max_position_embeddings=max_position_embeddings, **kwargs,
    )
    config = build_config(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attn_implementation,
            experts_implementation=experts_implementation,
        )
    model.generation_config = GenerationConfig(
        eos_token_id=list(cfg.eos_token_ids), pad_token_id=cfg.pad_token_id, bos_token_id=None,
    )
    return model.eval()
