"""Fused in-memory MoE expert tensors <-> the per-expert checkpoint names inference engines load.

In ``transformers`` 5 the experts of a layer live in two 3-D parameters::

    model.layers.{i}.mlp.experts.gate_up_proj   [E, 2*I, H]   (gate rows first, then up rows)
    model.layers.{i}.mlp.experts.down_proj      [E, H, I]

while checkpoints (and vLLM's ``load_weights``) name every expert's matrices separately, in
``nn.Linear`` layout ``[out, in]``:

* glm4_moe, qwen3_moe (the qwen2_moe family): ``mlp.experts.{e}.gate_proj.weight`` /
  ``up_proj.weight`` / ``down_proj.weight``;
* mixtral: the block is called ``block_sparse_moe`` and the matrices ``w1`` (gate), ``w3`` (up),
  ``w2`` (down): ``block_sparse_moe.experts.{e}.w1.weight``, and ``block_sparse_moe.gate.weight``.

These are exactly the names ``save_pretrained`` writes (the tests check it tensor by tensor), so the
same stream serves a vLLM weight update and a checkpoint. Everything here is pure and CPU-only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

import torch

_FUSED = re.compile(r"^(?P<prefix>.*)\.mlp\.experts\.(?P<kind>gate_up_proj|down_proj)$")
_PER_EXPERT = re.compile(
    r"^(?P<prefix>.*)\.(?:mlp|block_sparse_moe)\.experts\.(?P<e>\d+)\.(?P<proj>\w+)\.weight$"
)

EXPERT_NAMES = {
    # model_type: (block name, gate, up, down)
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
}
DEFAULT_EXPERT_NAMES = ("mlp", "gate_proj", "up_proj", "down_proj")


def expert_names(model_type: str) -> tuple[str, str, str, str]:
    """(block, gate, up, down) checkpoint names for ``model_type``."""
    return EXPERT_NAMES.get(model_type, DEFAULT_EXPERT_NAMES)


def _rename_block(name: str, block: str) -> str:
    """Mixtral's non-expert MoE parameters (the router) also live under ``block_sparse_moe``."""
    if block == "mlp":
        return name
    return re.sub(r"\.mlp\.(gate\.|experts\.)", rf".{block}.\1", name)


def unfuse_experts(
    state: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], model_type: str,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(checkpoint_name, tensor)`` for an in-memory state dict (views; nothing is copied)."""
    block, gate, up, down = expert_names(model_type)
    items = state.items() if isinstance(state, Mapping) else state
    for name, tensor in items:
        m = _FUSED.match(name)
        if m is None:
            yield _rename_block(name, block), tensor
            continue
        if tensor.dim() != 3:
            raise ValueError(f"{name}: expected a fused [experts, out, in] tensor, got shape {tuple(tensor.shape)}")
        base = f"{m['prefix']}.{block}.experts"
        if m["kind"] == "gate_up_proj":
            if tensor.shape[1] % 2:
                raise ValueError(f"{name}: gate_up_proj has an odd output dim {tensor.shape[1]}")
            half = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                yield f"{base}.{e}.{gate}.weight", tensor[e, :half]
                yield f"{base}.{e}.{up}.weight", tensor[e, half:]
        else:
            for e in range(tensor.shape[0]):
                yield f"{base}.{e}.{down}.weight", tensor[e]


def fuse_experts(named: Iterable[tuple[str, torch.Tensor]], model_type: str) -> dict[str, torch.Tensor]:
    """Inverse of :func:`unfuse_experts`: per-expert checkpoint names back to the fused state dict."""
    block, gate, up, down = expert_names(model_type)
    role = {gate: "gate", up: "up", down: "down"}
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in named:
        m = _PER_EXPERT.match(name)
        if m is None or m["proj"] not in role:
            out[name.replace(f".{block}.", ".mlp.")] = tensor
            continue
        parts.setdefault(m["prefix"], {}).setdefault(role[m["proj"]], {})[int(m["e"])] = tensor
    for prefix, roles in parts.items():
        n = {r: len(v) for r, v in roles.items()}
        if set(n) != {"gate", "up", "down"} or len(set(n.values())) != 1:
            raise ValueError(f"{prefix}: incomplete experts, counts per matrix {n}")
        for r, v in roles.items():
            if sorted(v) != list(range(len(v))):
                raise ValueError(f"{prefix}: {r} expert indices are not 0..{len(v) - 1}: {sorted(v)}")
        num = n["gate"]
        out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([roles["gate"][e], roles["up"][e]], dim=0) for e in range(num)]
        )
        out[f"{prefix}.mlp.experts.down_proj"] = torch.stack([roles["down"][e] for e in range(num)])
    return out


def checkpoint_weights(model, *, include_tied: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """The per-expert checkpoint stream of a Hugging Face model's current weights (detached views).

    Non-persistent buffers (rotary caches) are not in ``state_dict`` and so never sent. A tied LM head
    is skipped unless ``include_tied`` (vLLM ties it itself when the config says so).
    """
    state = model.state_dict()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied and not include_tied:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    for name, tensor in unfuse_experts(state, model.config.model_type):
        yield name, tensor.detach()


def buckets(named: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a weight stream into lists of at most ``max_bytes`` (a single larger tensor goes alone)."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket
