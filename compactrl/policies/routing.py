"""MoE routes: record the experts each token was routed to, replay them in the learner, and count
where two computations disagree.

The seam is the router module of each MoE layer. In transformers 5.x a router's ``forward`` returns
``(router_logits, topk_weights, topk_indices)`` and the MoE block hands the indices and weights to its
experts; a forward hook on the router sees all three and may return replacements.

* :class:`RouteRecorder` records ``topk_indices`` of every router at every forward.
* :func:`replay_routes` (a context manager) makes every router use given expert ids while the gate
  weights are recomputed from the model's own router logits for exactly those experts, the way the
  router computes them (so the router still gets gradients):

  - ``sigmoid`` (``glm4_moe``, ``glm4_moe_lite``, ``glm_moe_dsa``): ``s = sigmoid(logits)``; the
    correction bias only chooses experts, so it plays no part; ``w = s[ids]``, divided by
    ``sum(w) + 1e-20`` when ``norm_topk_prob``, times ``routed_scaling_factor``;
  - ``softmax`` (``qwen3_moe``): ``p = softmax(logits)`` in float32, ``w = p[ids]``, divided by
    ``sum(w)`` when ``norm_topk_prob``, cast to the logits' dtype;
  - ``softmax_renorm`` (``mixtral``): ``p = softmax(logits.float())``, ``w = p[ids] / sum(p[ids])``.

A *route* is one token's expert ids, ``[moe_layers, k]`` (MoE layers in model order; dense layers such
as GLM's ``first_k_dense_replace`` ones have no router and no entry). Routes are stored compactly:
``uint8`` while ids fit below the sentinel 255, else ``int16`` with sentinel -1. The sentinel marks a
token without a route (padding, a token the sampler never ran through the model).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

#: router class name -> how its gate weights are computed (see the module doc)
ROUTER_KINDS: dict[str, str] = {
    "Glm4MoeTopkRouter": "sigmoid",
    "Glm4MoeLiteTopkRouter": "sigmoid",
    "GlmMoeDsaTopkRouter": "sigmoid",
    "DeepseekV3TopkRouter": "sigmoid",
    "Qwen3MoeTopKRouter": "softmax",
    "MixtralTopKRouter": "softmax_renorm",
}

UINT8_NO_ROUTE = 255
INT16_NO_ROUTE = -1


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's router modules in layer order (empty for a dense model, or anything not a module)."""
    if not isinstance(model, nn.Module):
        return []
    return [m for m in model.modules() if type(m).__name__ in ROUTER_KINDS]


def moe_layer_indices(model: nn.Module) -> list[int]:
    """The decoder-layer index of each router, in order (``model.layers.<i>...``): which layers of an
    engine's per-decoder-layer routes (vLLM's) are MoE layers."""
    out = []
    for name, module in model.named_modules():
        if type(module).__name__ in ROUTER_KINDS:
            match = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
            if match is None:
                raise ValueError(f"router {name!r}: no decoder layer index in its name")
            out.append(int(match.group(1)))
    return out


def checkpoint_moe_layers(path: str) -> list[int]:
    """:func:`moe_layer_indices` of the model saved at ``path`` (built on the meta device: no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return moe_layer_indices(model)


def num_experts(model: nn.Module) -> int:
    cfg = model.config
    return int(getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
               or getattr(cfg, "n_routed_experts", 0))


def route_dtype(experts: int) -> np.dtype:
    """``uint8`` when every id lies below the sentinel 255, else ``int16``."""
    return np.dtype(np.uint8) if experts <= UINT8_NO_ROUTE else np.dtype(np.int16)


def no_route(dtype) -> int:
    """The sentinel of a route dtype (numpy or torch): 255 for uint8, -1 otherwise."""
    return UINT8_NO_ROUTE if str(dtype).endswith("uint8") else INT16_NO_ROUTE


def compact_routes(routes: Any, experts: int | None = None) -> np.ndarray:
    """``[T, layers, k]`` routes (nested lists, numpy or torch; negative ids meaning no route) as a compact
    numpy array; the dtype follows ``experts`` when given, else the largest id."""
    arr = routes.detach().cpu().numpy() if isinstance(routes, torch.Tensor) else np.asarray(routes)
    if arr.ndim != 3:
        raise ValueError(f"routes: expected [tokens, layers, k], got shape {arr.shape}")
    if arr.dtype == np.uint8:
        missing = arr == UINT8_NO_ROUTE
    else:
        arr = arr.astype(np.int64)
        missing = arr < 0
    top = int(arr[~missing].max()) + 1 if (~missing).any() else 0
    dtype = route_dtype(max(top, experts or 0))
    out = arr.astype(dtype)
    out[missing] = no_route(dtype)
    return out


def route_mask(routes: torch.Tensor) -> torch.Tensor:
    """``[..., layers, k]`` routes -> ``[...]`` bool: the token has a route (no sentinel anywhere)."""
    sentinel = no_route(routes.dtype)
    return (routes != sentinel).all(-1).all(-1)


class RouteRecorder:
    """Forward hooks that keep the expert ids of each router's latest forward.

    ``with RouteRecorder(model) as rec: model(...); routes = rec.take(batch, seq)`` gives the routes of
    that forward as ``[batch, seq, layers, k]`` int64; ``keep_all=True`` also keeps every forward's
    (``forwards``). A model without routers records nothing (``rec.active`` is False and :meth:`take`
    returns None).
    """

    def __init__(self, model: nn.Module, *, keep_all: bool = False) -> None:
        self.routers = moe_routers(model)
        self.experts = num_experts(model) if self.routers else 0
        self.keep_all = keep_all
        self.forwards: list[list[torch.Tensor]] = []
        """With ``keep_all``: every forward's ids, ``[layer][tokens, k]`` (int64, on the CPU), in order."""
        self._last: list[torch.Tensor | None] = [None] * len(self.routers)
        self._handles: list[Any] = []

    @property
    def active(self) -> bool:
        return bool(self.routers)

    def __enter__(self) -> RouteRecorder:
        for layer, router in enumerate(self.routers):
            self._handles.append(router.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, layer: int):
        def hook(_module, _inputs, output):
            ids = output[2].detach()
            self._last[layer] = ids
            if self.keep_all:
                if layer == 0:
                    self.forwards.append([])
                self.forwards[-1].append(ids.cpu())

        return hook

    def take(self, batch: int, seq: int) -> torch.Tensor | None:
        """The routes of the latest forward, ``[batch, seq, layers, k]`` (int64), and forget them."""
        if not self.active:
            return None
        if any(x is None for x in self._last):
            raise RuntimeError("RouteRecorder.take: a router did not run in the latest forward")
        out = torch.stack([x.reshape(batch, seq, -1) for x in self._last], dim=2)
        self._last = [None] * len(self.routers)
        return out


def records_routes(generate):
    """Decorates :func:`compactrl.policies.transformers_policy.generate_tokens`: its results get their
    ``routed_experts``, ``[len(prompt) + len(generated), moe_layers, k]``.

    The routers' forwards during the generation are, in order: the prefill over the left-padded
    ``[prompts, longest prompt]`` batch (each prompt token's route; padding dropped), then one decode
    forward per step ``s >= 1`` over the rows that drew a token at step ``s`` (those with at least ``s``
    generated tokens, in prompt order), which routes each row's ``s``-th token. A generated token no
    forward ran (the last one, when the generation stopped) holds the sentinel. A forward count or
    shape that does not fit this layout is an error, not a silent misalignment.
    """

    @functools.wraps(generate)
    def wrapper(model, prompts, *args, **kwargs):
        with RouteRecorder(model, keep_all=True) as recorder:
            results = generate(model, prompts, *args, **kwargs)
        if recorder.active:
            for res, routes in zip(results, generation_routes(recorder, prompts, results)):
                res.routed_experts = routes
        return results

    return wrapper


def generation_routes(recorder: RouteRecorder, prompts: Sequence[Sequence[int]], results: Sequence[Any]
                      ) -> list[np.ndarray]:
    """Each prompt's routes from a generation's recorded forwards (the layout of :func:`records_routes`)."""
    forwards = recorder.forwards
    lengths = [len(r.token_ids) for r in results]
    width = max(len(p) for p in prompts)
    if not forwards or len(forwards) > max(lengths, default=0) + 1:
        raise RuntimeError(f"records_routes: {len(forwards)} forwards for a generation of at most "
                           f"{max(lengths, default=0)} steps")
    layers, k = len(forwards[0]), forwards[0][0].shape[-1]
    out = [np.full((len(p) + n, layers, k), -1, dtype=np.int64) for p, n in zip(prompts, lengths)]
    prefill = torch.stack([x.reshape(len(prompts), width, k) for x in forwards[0]], dim=2).numpy()
    for i, p in enumerate(prompts):
        out[i][:len(p)] = prefill[i, width - len(p):]
    for step, per_layer in enumerate(forwards[1:], start=1):
        rows = [i for i, n in enumerate(lengths) if n >= step]
        if per_layer[0].shape[0] != len(rows):
            raise RuntimeError(f"records_routes: decode step {step} routed {per_layer[0].shape[0]} tokens, "
                               f"{len(rows)} rows drew a token")
        routes = torch.stack(per_layer, dim=1).numpy()
        for j, i in enumerate(rows):
            out[i][len(prompts[i]) + step - 1] = routes[j]
    return [compact_routes(r, recorder.experts) for r in out]


# --------------------------------------------------------------------------------------------------
# replay


def replay_weights(router: nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gate weights of experts ``ids`` (``[tokens, k]``) from ``logits``, as ``router`` computes them."""
    kind = ROUTER_KINDS[type(router).__name__]
    if kind == "sigmoid":
        w = logits.float().sigmoid().gather(1, ids)
        if router.norm_topk_prob:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * router.routed_scaling_factor
    probs = torch.softmax(logits.float(), dim=-1)
    w = probs.gather(1, ids)
    if kind == "softmax_renorm" or router.norm_topk_prob:
        w = w / w.sum(dim=-1, keepdim=True)
    return w.to(logits.dtype) if kind == "softmax" else w


@contextlib.contextmanager
def replay_routes(model: nn.Module, routes: torch.Tensor | None) -> Iterator[None]:
    """Inside, every forward of ``model`` over ``[N, L]`` tokens routes with ``routes`` (``[N, L, layers,
    k]``): where a token has a route, the router's ids are replaced by it and the weights recomputed
    (:func:`replay_weights`); where it has none (sentinel), the router's own choice stands.
    ``routes=None`` or a dense model: no change."""
    routers = moe_routers(model)
    if routes is None or not routers:
        yield
        return
    if routes.shape[-2] != len(routers):
        raise ValueError(f"routed_experts has {routes.shape[-2]} MoE layers, the model has {len(routers)}")
    flat = routes.reshape(-1, routes.shape[-2], routes.shape[-1])
    have = route_mask(flat)
    ids_all = flat.long()

    def hook_for(layer: int):
        def hook(router, _inputs, output):
            logits, _w, own = output
            if own.shape[0] != flat.shape[0]:
                raise ValueError(f"replay_routes: the forward routed {own.shape[0]} tokens, routes hold "
                                 f"{flat.shape[0]}")
            ids = torch.where(have[:, None].to(own.device), ids_all[:, layer].to(own.device), own)
            return logits, replay_weights(router, logits, ids), ids

        return hook

    handles = [r.register_forward_hook(hook_for(i)) for i, r in enumerate(routers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def batch_replay(module: nn.Module | None, batch: Any, enabled: bool = True):
    """:func:`replay_routes` of ``batch["routed_experts"]`` (cut to the width of ``batch["tokens"]``) on
    ``module``'s routers when ``enabled``, the batch has routes and ``module`` is not None; else no change."""
    routes = batch.get("routed_experts", None) if enabled and module is not None else None
    if routes is not None:
        routes = routes[:, :batch["tokens"].shape[1]]
    return replay_routes(module, routes) if routes is not None else contextlib.nullcontext()


def critic_routers(critic: nn.Module) -> nn.Module | None:
    """The module whose routers replay in the critic: its trunk when it shares the policy's (the routes
    the sampler recorded are that trunk's), None for a separate copy (its routers are its own)."""
    return getattr(critic, "trunk", None) if getattr(critic, "share_trunk", False) else None


@torch.no_grad()
def forward_routes(model: nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor | None = None) -> torch.Tensor | None:
    """The routes a full forward over ``tokens`` (``[N, L]``) takes, ``[N, L, layers, k]`` int64 (None
    for a dense model); padding positions hold -1."""
    with RouteRecorder(model) as rec:
        if not rec.active:
            return None
        mask = attention_mask.long()
        pos = position_ids if position_ids is not None else (mask.cumsum(-1) - 1).clamp(min=0)
        model(input_ids=tokens, attention_mask=mask, position_ids=pos, use_cache=False)
        routes = rec.take(*tokens.shape)
    return routes.masked_fill(~attention_mask.bool()[..., None, None], -1)


# --------------------------------------------------------------------------------------------------
# disagreement


def route_disagreement(sampled: torch.Tensor, learner: torch.Tensor, where: torch.Tensor) -> tuple[int, int]:
    """(tokens whose expert sets differ in at least one layer, tokens compared) over positions ``where``
    (``[N, L]`` bool) that have a route on both sides. Expert *sets* are compared: the order of the ids
    within a layer's top-k does not count."""
    have = where.bool() & route_mask(sampled) & (learner >= 0).all(-1).all(-1)
    a = sampled[have].long().sort(dim=-1).values
    b = learner[have].long().sort(dim=-1).values
    differ = (a != b).any(-1).any(-1)
    return int(differ.sum()), int(have.sum())


def route_mismatch_metrics(batch: Any, learner: torch.Tensor | None) -> dict[str, float]:
    """The expert disagreement between the sampler's routes (``batch["routed_experts"]``) and the
    learner's (``learner``, ``[N, L, layers, k]`` from the learner's own forward over the batch): the
    fraction of tokens routed to a different expert set in at least one layer, over policy tokens that
    are not summary tokens (``task``), summary tokens (``summary``) and every token both sides routed
    (``all``: prompts and tool outputs too). A split without tokens is left out; {} without routes."""
    sampled = batch.get("routed_experts", None)
    if sampled is None or learner is None:
        return {}
    width = learner.shape[1]
    sampled = sampled[:, :width]
    policy, summary = batch["policy_mask"].bool(), batch["summary_mask"].bool()
    out = {}
    for name, where in (("task", policy & ~summary), ("summary", summary), ("all", batch["attention_mask"].bool())):
        differ, count = route_disagreement(sampled, learner, where[:, :width])
        if count:
            out[f"mismatch/route_disagree_{name}"] = differ / count
        if name == "all":
            out["mismatch/route_tokens"] = float(count)
    return out


def merge_routes(have: np.ndarray | None, new: Any) -> np.ndarray | None:
    """A trace's routes after a model call whose routes ``new`` cover its first ``len(new)`` positions: a
    position keeps the route of the first call that computed it (as a prefix cache would), and takes the
    call's route where it had none (the last sampled token of the previous response, new tokens).
    (:class:`compactrl.wrappers.context_budget.ContextBudget` keeps its traces' routes by the same rule.)"""
    if new is None:
        return have
    new = compact_routes(new)
    if have is None or have.shape[1:] != new.shape[1:] or have.dtype != new.dtype:
        return new.copy()
    out, n = have.copy(), min(len(have), len(new))
    missing = (out[:n] == no_route(out.dtype)).any(-1).any(-1)
    out[:n][missing] = new[:n][missing]
    return np.concatenate([out, new[len(out):]])


def prompt_and_output_routes(routes: Any, length: int, moe_layers: Sequence[int] | None = None) -> np.ndarray:
    """An engine's routes of a request (vLLM's ``routed_experts``: ``[seq_len, layers, k]`` over the prompt and
    the output, which may stop one short: the last sampled token is never run) as the compact
    ``[prompt + output, moe_layers, k]`` array :class:`~compactrl.policies.sampling.Generated` carries, the
    sentinel where the engine gave none. vLLM indexes its routes by decoder layer (its capturer's
    ``layer_id``), dense layers included; ``moe_layers`` (:func:`moe_layer_indices`) keeps the MoE ones."""
    arr = np.asarray(routes)
    if moe_layers is not None and arr.shape[1] != len(moe_layers):
        arr = arr[:, list(moe_layers)]
    arr = compact_routes(arr)
    if len(arr) > length:
        raise ValueError(f"routed_experts: {len(arr)} routes for a request of {length} tokens")
    pad = np.full((length - len(arr), *arr.shape[1:]), no_route(arr.dtype), dtype=arr.dtype)
    return np.concatenate([arr, pad])


def encode_routes(routes: Any) -> str | None:
    """Routes as one short JSON-safe string, ``"<dtype>:<T>,<layers>,<k>:<base64 bytes>"`` (None stays None)."""
    if routes is None:
        return None
    arr = compact_routes(routes)
    data = base64.b64encode(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()).decode()
    return f"{arr.dtype.name}:{','.join(map(str, arr.shape))}:{data}"


def decode_routes(text: str | None) -> np.ndarray | None:
    """The inverse of :func:`encode_routes`."""
    if text is None:
        return None
    dtype, shape, data = text.split(":", 2)
    if dtype not in ("uint8", "int16"):
        raise ValueError(f"routed_experts: expected a uint8 or int16 encoding, got {dtype!r}")
    dims = tuple(int(x) for x in shape.split(","))
    return np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(dims)


def routes_for_rows(rows: Sequence[Any], width: int, *, experts: int | None = None) -> torch.Tensor | None:
    """Per-row routes (``[T_i, layers, k]`` arrays, None where a row has none) right-padded with the
    sentinel into one ``[N, width, layers, k]`` tensor; None when no row has routes."""
    arrays = [None if r is None else compact_routes(r, experts) for r in rows]
    present = [a for a in arrays if a is not None]
    if not present:
        return None
    shape = present[0].shape[1:]
    if any(a.shape[1:] != shape for a in present):
        raise ValueError(f"routed_experts: rows disagree on [layers, k]: {sorted({a.shape[1:] for a in present})}")
    dtype = np.dtype(np.int16) if any(a.dtype == np.int16 for a in present) else np.dtype(np.uint8)
    out = np.full((len(rows), width, *shape), no_route(dtype), dtype=dtype)
    for i, a in enumerate(arrays):
        if a is not None:
            n = min(len(a), width)
            out[i, :n] = compact_routes(a[:n], 256 if dtype == np.int16 else None) if a.dtype != dtype else a[:n]
    return torch.from_numpy(out)


__all__ = [
    "INT16_NO_ROUTE", "ROUTER_KINDS", "RouteRecorder", "UINT8_NO_ROUTE", "batch_replay", "checkpoint_moe_layers",
    "compact_routes", "critic_routers", "decode_routes", "encode_routes", "forward_routes", "generation_routes",
    "merge_routes", "moe_layer_indices", "moe_routers", "no_route", "num_experts", "prompt_and_output_routes",
    "records_routes", "replay_routes", "replay_weights", "route_disagreement", "route_dtype", "route_mask",
    "route_mismatch_metrics", "routes_for_rows",
]
