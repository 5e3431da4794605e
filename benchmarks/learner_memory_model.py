"""Memory per GPU of the sharded learner (policy + critic), on paper: a pure-python model.

What it counts, per GPU, for a GLM MoE policy and its critic (the policy's trunk plus a scalar value
head, with its own parameters and optimiser), trained by the FSDP2 learner (``fully_shard`` on every
decoder layer and on the root module; ZeRO-3 semantics: parameters, gradients and optimizer state
are split evenly over the N data-parallel ranks):

* **state** = parameters + gradients + AdamW state, in bytes per parameter (``Precision``):
  the learner's default is fp32 sharded parameters (FSDP2's bf16 ``MixedPrecisionPolicy`` only casts
  the gathered copy), fp32 gradients, two fp32 moments: 4 + 4 + 8 = 16 B. ``BF16_MASTER`` is the
  other common layout (bf16 parameters and gradients, an fp32 master copy in the optimiser):
  2 + 2 + 4 + 8 = 16 B too.
* **sharding**: ``ep == 1``: everything / N. ``ep > 1`` (expert parallelism, *not implemented* in
  compactrl, see docs/distributed.md): a 2-D mesh ``("dp_shard", "ep")`` with N = dp_shard x ep;
  routed experts are split over ``ep`` on their expert dimension and (``expert_fsdp``) FSDP-sharded
  over the other N/ep ranks too, so the steady state is still / N; without ``expert_fsdp`` the
  experts are only / ep (replicated over the data-parallel ranks).
* **FSDP buffers**: the gathered (unsharded) parameters of ``prefetch_layers`` decoder layers in the
  compute dtype (the layer running and the one prefetched), their unsharded gradients in the compute
  dtype and one layer's fp32 reduce-scatter buffer; plus the root unit (embedding, final norm, LM head
  or value head) gathered through the forward and the backward. With EP a MoE layer gathers only its
  ``E / ep`` local experts.
* **activations** of one micro-batch of ``tokens`` tokens (64k) per GPU, bf16, flash/SDPA attention
  (no T x T matrix; the kernel keeps q, k, v, the output and an fp32 log-sum-exp per head). Elements
  saved for the backward per token and layer (H hidden, nh heads, hd head width, kv key/value heads,
  k experts per token, mI expert width, ns shared experts, E experts, I dense width):

  - every RMSNorm of width n: 4n (its fp32 input, the normalised value, its output);
  - GQA attention: 4H (input norm) + nh*hd (q) + 2*kv*hd (k, v) + 2*nh*hd (the output and o_proj's
    contiguous copy of it) + 2*nh (fp32 lse);
    MLA: 4H + 4*q_lora + 4*kv_lora (the low-rank norms) + 2*rope + 2*nh*qk (q, k) + nh*(nope + v)
    (kv_b_proj's output, which holds v) + 2*nh*v (output and copy) + 2*nh;
  - dense MLP: 4H (post-attention norm) + 4I (gate, silu(gate), up, their product);
  - MoE: 4H + 2H (the router's fp32 input) + 4E (fp32 logits, scores) + k*(2H + 4mI) (per routed copy:
    the dispatched input, gate/up, silu output, product, the expert output kept for the weighted
    combine) + ns*4mI (shared expert).

  These match what transformers' modules save (``saved_tensors_hooks`` on CPU, tiny glm4_moe and
  glm4_moe_lite layers in bf16 with SDPA and grouped_mm experts: within 2%, checked by the test).
  With activation checkpointing each layer keeps only its input (H per token) and one layer is
  recomputed at a time: + 2 x one layer's saved set (its activations and their gradients).
* **LM head**: unchunked, the logits of all T tokens: T*V*(2 bf16 logits + 4 fp32 log-softmax kept for
  the backward + 4 fp32 gradient) bytes; chunked (``logprob_chunk_tokens``, each chunk recomputed in
  the backward) c*V*10 bytes plus T*8 (fp32 log-prob and entropy per token). The critic's head is
  one scalar per token. Policy and critic run their backward one after the other: the activation peak
  is the larger of the two, not the sum.

Not modelled: the CUDA context and NCCL buffers (~1-3 GiB), allocator fragmentation, a frozen
reference policy (compactrl's PPO has none by default), the routed-experts replay record (T x L x k
small ints: ~12 MiB at 64k tokens for GLM-4.5-Air). Figures are estimates (+-20% on activations).

Parameter counts come from the checkpoints' config values (sources below) and are checked against
``sum(p.numel())`` of real ``transformers`` models of the same architectures in
tests/training/test_learner_memory_model.py. Sources of the config values (public):

* GLM-4.7-Flash (``glm4_moe_lite``): the defaults of ``Glm4MoeLiteConfig``,
  huggingface/transformers ``src/transformers/models/glm4_moe_lite/configuration_glm4_moe_lite.py``
  @ 3de8fbf1e7a09e24459ce86dac34379d3561d449 (47 layers, 1 dense, 64 experts of 1536, top-4, MLA ranks
  768 / 512, head widths 192 + 64 / 256, vocabulary 154880); the MLA widths cross-checked with
  sgl-project/sglang ``python/sglang/srt/configs/glm4_moe_lite.py`` @ e63bd2af09ee3834ed57355d6a336cb56a9bf4e5.
  ``num_nextn_predict_layers`` 1 (one MTP layer, both checkpoints) is the Hub config.json's value as
  public test fixtures copy it; the Hub files themselves were not read here.
* GLM-4.5-Air (``glm4_moe``): ``CONFIG_100B`` in huggingface/transformers
  ``src/transformers/models/glm4_moe/convert_glm4_moe_weights_to_hf.py``
  @ 08bd427d3b7a87f191248d766f929ec60470b42f (attention_bias true, head_dim 128, 46 layers, 128
  experts of 1408), matching the Megatron arguments of vllm-project/vime
  ``scripts/models/glm4.5-106B-A12B.sh`` @ b332ffc2c80e204ad520f93daa0aa7d1e65294d8.

Run::

    python benchmarks/learner_memory_model.py            # the tables of docs/distributed.md
    python benchmarks/learner_memory_model.py --json     # the same figures as JSON
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1024 ** 3
H100_GIB = 78.0
"""Usable memory of an 80 GB H100 (what ``torch.cuda.mem_get_info`` reports, about 79.1 GiB, less ~1 GiB)."""
H200_GIB = 139.0
"""Usable memory of a 141 GB H200 (about 140 GiB reported, less ~1 GiB)."""


@dataclass(frozen=True)
class MoEArch:
    """The shape of a GLM MoE checkpoint, enough to count its parameters and activations."""

    name: str
    attention: str  # "gqa" (glm4_moe) or "mla" (glm4_moe_lite)
    vocab_size: int
    hidden_size: int
    num_layers: int
    dense_layers: int
    intermediate_size: int
    n_routed_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    n_shared_experts: int
    num_attention_heads: int
    num_key_value_heads: int = 0
    head_dim: int = 0
    attention_bias: bool = False
    use_qk_norm: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    tie_word_embeddings: bool = False
    mtp_layers: int = 0
    published_total: float = 0.0
    published_active: float = 0.0


def arch_from_config(cfg: Mapping[str, Any], name: str = "", **published: float) -> MoEArch:
    """A ``MoEArch`` from a config.json dict (``glm4_moe`` or ``glm4_moe_lite``)."""
    kind = cfg["model_type"]
    if kind not in ("glm4_moe", "glm4_moe_lite"):
        raise ValueError(f"model_type must be glm4_moe or glm4_moe_lite, got {kind!r}")
    layers = cfg["num_hidden_layers"]
    if cfg.get("mlp_layer_types"):
        dense = sum(1 for t in cfg["mlp_layer_types"] if t == "dense")
    else:
        dense = cfg.get("first_k_dense_replace", 1)
    common = dict(
        name=name or kind, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_layers=layers,
        dense_layers=dense, intermediate_size=cfg["intermediate_size"], n_routed_experts=cfg["n_routed_experts"],
        experts_per_token=cfg["num_experts_per_tok"], moe_intermediate_size=cfg["moe_intermediate_size"],
        n_shared_experts=cfg.get("n_shared_experts", 1), num_attention_heads=cfg["num_attention_heads"],
        attention_bias=bool(cfg.get("attention_bias", False)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mtp_layers=cfg.get("num_nextn_predict_layers", cfg.get("num_mtp_layers", 0)) or 0, **published,
    )
    if kind == "glm4_moe":
        return MoEArch(attention="gqa", num_key_value_heads=cfg["num_key_value_heads"],
                       head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
                       use_qk_norm=bool(cfg.get("use_qk_norm", False)), **common)
    return MoEArch(attention="mla", q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=cfg["kv_lora_rank"],
                   qk_rope_head_dim=cfg["qk_rope_head_dim"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
                   v_head_dim=cfg["v_head_dim"], **common)


# GLM-4.7-Flash: the checkpoint's config values (sources in the module docstring).
GLM_4_7_FLASH = arch_from_config({
    "model_type": "glm4_moe_lite", "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240,
    "moe_intermediate_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20,
    "n_shared_experts": 1, "n_routed_experts": 64, "num_experts_per_tok": 4, "kv_lora_rank": 512,
    "q_lora_rank": 768, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "v_head_dim": 256,
    "first_k_dense_replace": 1, "attention_bias": False, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}, "GLM-4.7-Flash (30B-A3B)", published_total=30e9, published_active=3e9)

# GLM-4.5-Air: the checkpoint's config values (sources in the module docstring).
GLM_4_5_AIR = arch_from_config({
    "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8,
    "head_dim": 128, "attention_bias": True, "use_qk_norm": False, "n_shared_experts": 1,
    "n_routed_experts": 128, "num_experts_per_tok": 8, "first_k_dense_replace": 1, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}, "GLM-4.5-Air (106B-A12B)", published_total=106e9, published_active=12e9)

MODELS = (GLM_4_7_FLASH, GLM_4_5_AIR)


# -- parameters ------------------------------------------------------------------------------------

def attention_params(a: MoEArch) -> int:
    """One layer's attention: projections, their biases, MLA's low-rank norms, qk norms."""
    h, nh = a.hidden_size, a.num_attention_heads
    if a.attention == "gqa":
        q, kv = nh * a.head_dim, a.num_key_value_heads * a.head_dim
        n = h * q + 2 * h * kv + q * h
        n += (q + 2 * kv) if a.attention_bias else 0  # q/k/v biases (o_proj has none)
        return n + (2 * a.head_dim if a.use_qk_norm else 0)
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    bias = a.attention_bias
    if a.q_lora_rank is None:
        n = h * nh * qk
    else:  # q_a_proj, q_a_layernorm, q_b_proj
        n = h * a.q_lora_rank + (a.q_lora_rank if bias else 0) + a.q_lora_rank + a.q_lora_rank * nh * qk
    kv_a = a.kv_lora_rank + a.qk_rope_head_dim
    n += h * kv_a + (kv_a if bias else 0) + a.kv_lora_rank  # kv_a_proj_with_mqa, kv_a_layernorm
    n += a.kv_lora_rank * nh * (a.qk_nope_head_dim + a.v_head_dim)  # kv_b_proj
    return n + nh * a.v_head_dim * h + (h if bias else 0)  # o_proj


def routed_expert_params(a: MoEArch) -> int:
    """One MoE layer's routed experts (fused gate_up_proj [E, 2I, H] and down_proj [E, H, I])."""
    return a.n_routed_experts * 3 * a.hidden_size * a.moe_intermediate_size


def param_counts(a: MoEArch) -> dict[str, int]:
    """Trainable parameters by part, as ``transformers`` builds the model (no MTP layer; the router's
    ``e_score_correction_bias`` is a buffer there, not a parameter: listed apart, not in ``total``)."""
    h = a.hidden_size
    moe_layers = a.num_layers - a.dense_layers
    parts = {
        "embedding": a.vocab_size * h,
        "lm_head": 0 if a.tie_word_embeddings else a.vocab_size * h,
        "final_norm": h,
        "attention": a.num_layers * attention_params(a),
        "layer_norms": a.num_layers * 2 * h,
        "dense_mlp": a.dense_layers * 3 * h * a.intermediate_size,
        "shared_experts": moe_layers * 3 * h * a.moe_intermediate_size * a.n_shared_experts,
        "routed_experts": moe_layers * routed_expert_params(a),
        "router": moe_layers * a.n_routed_experts * h,
    }
    parts["total"] = sum(parts.values())
    parts["router_bias_buffer"] = moe_layers * a.n_routed_experts
    one_moe_layer = attention_params(a) + 2 * h + 3 * h * a.moe_intermediate_size * (a.n_shared_experts
                                                                                   + a.n_routed_experts)
    one_moe_layer += a.n_routed_experts * (h + 1)
    # DeepSeek-style MTP layer: a MoE decoder layer + enorm, hnorm, eh_proj [H, 2H], shared_head.norm
    # (any copy of the embedding / LM head it stores is not counted)
    parts["mtp_layers"] = a.mtp_layers * (one_moe_layer + 3 * h + 2 * h * h)
    parts["checkpoint_total"] = parts["total"] + parts["router_bias_buffer"] + parts["mtp_layers"]
    routed_active = moe_layers * a.experts_per_token * 3 * h * a.moe_intermediate_size
    parts["active"] = parts["total"] - parts["routed_experts"] + routed_active
    parts["active_without_embedding"] = parts["active"] - parts["embedding"]  # the input lookup is no matmul
    return parts


def critic_params(a: MoEArch) -> dict[str, int]:
    """The critic: the policy's trunk (no LM head) plus a scalar value head (H weights + 1 bias)."""
    p = param_counts(a)
    out = {k: v for k, v in p.items() if k in ("embedding", "final_norm", "attention", "layer_norms", "dense_mlp",
                                                "shared_experts", "routed_experts", "router")}
    out["value_head"] = a.hidden_size + 1
    out["total"] = sum(out.values())
    return out


# -- memory ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of the learner's state and of the gathered compute copy."""

    param: int = 4
    grad: int = 4
    master: int = 0
    moments: int = 8  # AdamW's two fp32 moments
    compute: int = 2  # the all-gathered copy (bf16 mixed precision)
    reduce: int = 4  # the reduce-scatter of gradients (fp32)

    @property
    def state(self) -> int:
        return self.param + self.grad + self.master + self.moments


FP32_SHARDS = Precision()
"""The learner (docs/distributed.md): fp32 shards, bf16 compute (``learner.mixed_precision bf16``)."""
BF16_MASTER = Precision(param=2, grad=2, master=4)
"""bf16 parameters and gradients, fp32 master weights in the optimiser."""


@dataclass(frozen=True)
class Layout:
    """How N GPUs shard the learner: data parallel (FSDP) and optionally an expert dimension."""

    gpus: int
    ep: int = 1
    expert_fsdp: bool = True
    prefetch_layers: int = 2
    precision: Precision = FP32_SHARDS

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.ep < 1 or self.gpus % self.ep:
            raise ValueError(f"gpus ({self.gpus}) must be a positive multiple of ep ({self.ep})")


def _split(parts: Mapping[str, int]) -> tuple[int, int]:
    """(routed-expert parameters, all the others) of a parameter breakdown."""
    experts = parts["routed_experts"]
    return experts, parts["total"] - experts


def state_bytes(parts: Mapping[str, int], layout: Layout) -> dict[str, float]:
    """Per-GPU parameters, gradients and optimizer state of one model (policy or critic)."""
    experts, others = _split(parts)
    expert_shards = layout.gpus if (layout.ep == 1 or layout.expert_fsdp) else layout.ep
    per_gpu = others / layout.gpus + experts / expert_shards
    p = layout.precision
    return {"params": per_gpu * p.param, "grads": per_gpu * p.grad,
            "optimizer": per_gpu * (p.master + p.moments), "params_per_gpu": per_gpu}


def fsdp_buffer_bytes(a: MoEArch, root_params: int, layout: Layout) -> float:
    """Gathered parameters (and their unsharded gradients) of the layers in flight plus the root unit."""
    moe_layer = (attention_params(a) + 2 * a.hidden_size + 3 * a.hidden_size * a.moe_intermediate_size
                 * a.n_shared_experts + a.n_routed_experts * a.hidden_size
                 + routed_expert_params(a) // layout.ep)
    dense_layer = attention_params(a) + 2 * a.hidden_size + 3 * a.hidden_size * a.intermediate_size
    layer = max(moe_layer, dense_layer)
    p = layout.precision
    layers = layout.prefetch_layers * layer * (2 * p.compute) + layer * p.reduce
    return layers + root_params * (2 * p.compute + p.reduce)


NORM = 4
"""bf16 elements an RMSNorm of width n keeps per token, times n: its fp32 input (2), the normalised bf16
value its weight's gradient needs (1), its output, the next projection's input (1)."""


def _attention_saved(a: MoEArch) -> float:
    h, nh = a.hidden_size, a.num_attention_heads
    if a.attention == "gqa":  # q, k, v, the output and o_proj's contiguous copy of it, fp32 lse
        return NORM * h + 3 * nh * a.head_dim + 2 * a.num_key_value_heads * a.head_dim + 2 * nh
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    q_lora = NORM * a.q_lora_rank if a.q_lora_rank else 0
    # q, k (nope + rope), kv_b_proj's output (holds v), the output and o_proj's copy of it, fp32 lse
    heads = 2 * nh * qk + nh * (a.qk_nope_head_dim + a.v_head_dim) + 2 * nh * a.v_head_dim + 2 * nh
    return NORM * h + q_lora + NORM * a.kv_lora_rank + 2 * a.qk_rope_head_dim + heads


def layer_saved_elements(a: MoEArch, moe: bool = True) -> float:
    """bf16 elements one layer keeps per token for its backward (fp32 ones count twice), as transformers'
    eager modules save them (checked against saved-tensor hooks on CPU by the test)."""
    h = a.hidden_size
    if not moe:  # SwiGLU: gate (silu's input), silu's output, up, their product (down's input)
        return _attention_saved(a) + NORM * h + 4 * a.intermediate_size
    k, mi = a.experts_per_token, a.moe_intermediate_size
    router = 2 * h + 4 * a.n_routed_experts  # its fp32 input copy, fp32 logits and scores
    experts = k * (2 * h + 4 * mi)  # per copy: dispatched input, gate/up, silu out, product, output
    return _attention_saved(a) + NORM * h + router + experts + a.n_shared_experts * 4 * mi


def activation_bytes(a: MoEArch, tokens: int, *, checkpointing: bool, chunk: int = 0,
                     head: str = "lm") -> dict[str, float]:
    """Activation memory of one micro-batch of ``tokens`` tokens (bf16): the layers and the head."""
    moe_layers = a.num_layers - a.dense_layers
    per_token = moe_layers * layer_saved_elements(a) + a.dense_layers * layer_saved_elements(a, moe=False)
    largest = max(layer_saved_elements(a), layer_saved_elements(a, moe=False))
    if checkpointing:  # each layer keeps its input; one layer at a time is recomputed (+ its gradients)
        layers = tokens * (a.num_layers * a.hidden_size + 2 * largest) * 2
    else:
        layers = tokens * per_token * 2
    if head == "value":
        logits = tokens * 4.0 * 2
    elif chunk and chunk < tokens:
        logits = chunk * a.vocab_size * 10.0 + tokens * 8.0
    else:
        logits = tokens * a.vocab_size * 10.0
    return {"layers": layers, "head": logits, "total": layers + logits}


def per_gpu(a: MoEArch, layout: Layout, *, tokens: int = 65536, checkpointing: bool, chunk: int = 0) -> dict:
    """Peak memory per GPU of the policy plus the critic under ``layout`` (bytes, by part)."""
    pol, cri = param_counts(a), critic_params(a)
    sp, sc = state_bytes(pol, layout), state_bytes(cri, layout)
    out = {key: sp[key] + sc[key] for key in ("params", "grads", "optimizer")}
    root_pol = pol["embedding"] + pol["lm_head"] + pol["final_norm"]
    root_cri = cri["embedding"] + cri["final_norm"] + cri["value_head"]
    out["fsdp_buffers"] = max(fsdp_buffer_bytes(a, root_pol, layout), fsdp_buffer_bytes(a, root_cri, layout))
    act_p = activation_bytes(a, tokens, checkpointing=checkpointing, chunk=chunk)
    act_c = activation_bytes(a, tokens, checkpointing=checkpointing, head="value")
    out["activations"] = max(act_p["total"], act_c["total"])  # the two backward passes do not overlap
    out["total"] = sum(out.values())
    return out


# -- tables ----------------------------------------------------------------------------------------

def _gib(x: float) -> str:
    return f"{x / GIB:,.1f}"


def _fits(total: float) -> str:
    return " / ".join("yes" if total / GIB <= cap else "no" for cap in (H100_GIB, H200_GIB))


def count_table() -> str:
    rows = ["| model | embedding + LM head | attention | dense MLP | shared experts | routed experts | router "
            "| norms | total (transformers) | + MTP layer, router bias (checkpoint) | published | difference "
            "| active per token (without the input embedding) | published active |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in MODELS:
        p = param_counts(a)
        b = lambda x: f"{x / 1e9:.3f}B"  # noqa: E731
        diff = (p["total"] - a.published_total) / a.published_total
        norms = (p["layer_norms"] + p["final_norm"]) / 1e6
        rows.append(f"| {a.name} | {b(p['embedding'] + p['lm_head'])} | {b(p['attention'])} | {b(p['dense_mlp'])} "
                    f"| {b(p['shared_experts'])} | {b(p['routed_experts'])} | {b(p['router'])} | {norms:.2f}M "
                    f"| **{b(p['total'])}** | {b(p['checkpoint_total'])} | {a.published_total / 1e9:.0f}B "
                    f"| {diff:+.1%} | {b(p['active'])} ({b(p['active_without_embedding'])}) "
                    f"| {a.published_active / 1e9:.0f}B |")
    return "\n".join(rows)


def activation_table(tokens: int, chunk: int) -> str:
    rows = [f"| model | layers, no checkpointing | layers, checkpointing | LM head, all {tokens} tokens "
            f"| LM head, chunks of {chunk} | critic head |", "|---|---|---|---|---|---|"]
    for a in MODELS:
        no = activation_bytes(a, tokens, checkpointing=False)
        ck = activation_bytes(a, tokens, checkpointing=True, chunk=chunk)
        critic = activation_bytes(a, tokens, checkpointing=True, head="value")
        rows.append(f"| {a.name} | {_gib(no['layers'])} | {_gib(ck['layers'])} | {_gib(no['head'])} "
                    f"| {_gib(ck['head'])} | {_gib(critic['head'])} |")
    return "\n".join(rows)


def memory_table(gpus: tuple[int, ...], tokens: int, chunk: int, ep: int = 1) -> str:
    rows = ["| model | GPUs | params | grads | optimizer | FSDP buffers | activations: none / ckpt+chunk "
            "| total: none / ckpt+chunk | fits H100 80GB / H200 141GB (ckpt+chunk) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for a in MODELS:
        for n in gpus:
            layout = Layout(gpus=n, ep=ep)
            bare = per_gpu(a, layout, tokens=tokens, checkpointing=False)
            best = per_gpu(a, layout, tokens=tokens, checkpointing=True, chunk=chunk)
            rows.append(f"| {a.name} | {n} | {_gib(best['params'])} | {_gib(best['grads'])} "
                        f"| {_gib(best['optimizer'])} | {_gib(best['fsdp_buffers'])} "
                        f"| {_gib(bare['activations'])} / {_gib(best['activations'])} "
                        f"| {_gib(bare['total'])} / **{_gib(best['total'])}** | {_fits(best['total'])} |")
    return "\n".join(rows)


def report(gpus: tuple[int, ...] = (8, 16, 64), tokens: int = 65536, chunk: int = 4096, ep: int = 8) -> str:
    return "\n\n".join([
        "Parameters (from the checkpoints' config values):", count_table(),
        f"Activations of one {tokens}-token micro-batch per GPU (GiB; the peak is the larger of policy and critic):",
        activation_table(tokens, chunk),
        f"Per GPU, policy + critic, FSDP over all GPUs (GiB; fp32 shards, bf16 compute, {tokens} tokens per GPU, "
        f"log-prob chunks of {chunk}):", memory_table(gpus, tokens, chunk),
        f"The same with expert parallelism on paper (mesh (dp_shard, ep), ep = {ep}, experts FSDP-sharded over "
        "dp_shard too; not implemented):", memory_table(tuple(n for n in gpus if n % ep == 0), tokens, chunk, ep=ep),
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 16, 64])
    p.add_argument("--tokens", type=int, default=65536, help="tokens per GPU per micro-batch")
    p.add_argument("--chunk", type=int, default=4096, help="log-prob chunk (learner.logprob_chunk_tokens)")
    p.add_argument("--ep", type=int, default=8, help="expert-parallel degree of the on-paper table")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    args = p.parse_args(argv)
    if args.json:
        out = {a.name: {"params": param_counts(a), "critic": critic_params(a), "per_gpu": {
            str(n): {ck: per_gpu(a, Layout(gpus=n), tokens=args.tokens, checkpointing=ck == "ckpt+chunk",
                                 chunk=args.chunk if ck == "ckpt+chunk" else 0)
                     for ck in ("none", "ckpt+chunk")} for n in args.gpus}} for a in MODELS}
        print(json.dumps(out, indent=1))
    else:
        print(report(tuple(args.gpus), args.tokens, args.chunk, args.ep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["MoEArch", "Precision", "Layout", "arch_from_config", "param_counts", "critic_params", "state_bytes",
           "fsdp_buffer_bytes", "activation_bytes", "per_gpu", "report", "MODELS"]
