"""The vLLM engine process: an in-process ``vllm.LLM`` behind a small request loop on a socket.

This file runs in the engine's own environment (``bash scripts/setup.sh --vllm`` builds
``.venv-vllm``: vLLM pins its own torch and a transformers older than compactrl's), started as a
script by :class:`compactrl.serving.vllm.client.VLLMEngine`::

    .venv-vllm/bin/python -P compactrl/serving/vllm/engine.py --fd N

It imports the standard library, torch and vllm only, never the compactrl package, whose
dependencies are not installed there: the protocol it answers (framing, tensors, ops) is
:mod:`compactrl.serving.vllm.wire`, loaded from beside this file. :func:`serve` answers one request
at a time until ``shutdown`` or until the learner closes its end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch


def _load_wire() -> Any:
    """The protocol module beside this file. Run as a script (``python -P``, in an environment without
    compactrl) it is loaded by path; imported within compactrl it is the package's own module."""
    if __package__:
        from compactrl.serving.vllm import wire

        return wire
    spec = importlib.util.spec_from_file_location("compactrl_vllm_wire", Path(__file__).with_name("wire.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wire = _load_wire()


# -- the engine (runs in the engine's environment) ------------------------------------------------


def moe_experts(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Any]]:
    """``(layer, experts kernel)`` for every MoE layer of a loaded vLLM model whose kernel is built."""
    found = []
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None:
            found.append((module, experts))
    return found


def reload_weights(worker: Any, named: Iterable[tuple[str, torch.Tensor]], *, repack_experts: bool = True,
                   ) -> dict[str, float]:
    """Load new weights into a worker's model through vLLM's own reload path; exact on CPU.

    ``worker.reload_weights(weights_iterator=...)`` is vLLM's supported way to replace the weights of
    a loaded model: layer by layer it puts the parameters back into their checkpoint layout, loads
    the tensors with each parameter's ``weight_loader`` (tensor-parallel shards, fused q/k/v and
    gate/up), runs the layer's post-load processing and copies the result into the kernel tensors'
    storage. For an MoE layer that processing (the unquantized method's ``_setup_kernel``) runs the
    experts kernel's own ``process_weights_after_loading`` only on the first load: on CUDA that step
    is a no-op, but the CPU experts use it to prepack ``w13``/``w2`` into their grouped-GEMM layout, so
    after a reload the CPU experts read unpacked weights as packed ones (reloading the very same
    weights moves log-probs by ~0.1, and nothing reports it). Running the experts kernel's
    ``process_weights_after_loading`` again for every MoE layer (``repack_experts``, CPU only)
    repacks them from the freshly loaded weights; then the engine equals the learner to float32
    rounding. ``repack_experts=False`` leaves that step out (the regression tests show what it breaks).
    """
    t0 = time.perf_counter()
    worker.reload_weights(weights_iterator=iter(list(named)))
    t_reload = time.perf_counter() - t0
    repacked = 0
    if repack_experts and _is_cpu(worker.model_runner):
        for layer, experts in moe_experts(worker.model_runner.model):
            experts.process_weights_after_loading(layer)
            repacked += 1
    return {"reload_s": t_reload, "repack_s": time.perf_counter() - t0 - t_reload, "moe_layers": float(repacked)}


class RouteCapture:
    """The expert ids the engine's own routers choose, per request and position (``capture_routes``).

    vLLM's MoE layers (``MoERunner``) pick experts in their router's ``select_experts``, which hands
    the logical ``topk_ids`` (``[step tokens, k]``) to the router's ``capture_fn`` before any expert
    load-balancing remap; that is vLLM's own seam for routed-experts capture, bound here to this class
    rather than to vLLM's capturer (which needs model runner V2). The tokens of one step are the
    scheduled tokens of every running request, flattened in the model runner's input-batch order: a
    forward pre-hook on the model reads that layout (``input_batch.req_ids``, ``query_start_loc``) and
    the positions the step computes, and a forward hook files each request's rows under their
    positions. Chunked prefill, decode and concurrent requests of any lengths map alike; a position no
    step computed (a prefix-cached prompt token, the last sampled token) has no route. Hooks fire only
    in eager mode (``enforce_eager``): a compiled model would not call back into Python per layer.
    """

    def __init__(self, runner: Any) -> None:
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        self.runner = runner
        self.layers = sorted(((m.layer_id, m) for m in runner.model.modules() if isinstance(m, MoERunner)),
                             key=lambda x: x[0])
        if not self.layers:
            raise ValueError("capture_routes: the served model has no MoE layer (no vLLM MoERunner), so it has "
                             "no routes to record; turn capture_routes off for a dense model")
        self.enabled = False
        self.routes: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._step: list[torch.Tensor | None] = []
        self._layout: tuple[list[str], list[int], torch.Tensor] | None = None
        runner.model.register_forward_pre_hook(self._pre, with_kwargs=True)
        runner.model.register_forward_hook(self._post)
        self.bind()

    @property
    def layer_ids(self) -> list[int]:
        return [i for i, _ in self.layers]

    def bind(self) -> None:
        """Set every MoE layer's router callback (again after a weight reload, which may rebuild kernels)."""
        for j, (_, layer) in enumerate(self.layers):
            if not hasattr(layer.router, "set_capture_fn"):
                raise ValueError(f"capture_routes: vLLM router {type(layer.router).__name__} takes no capture "
                                 "callback")
            layer.router.set_capture_fn(lambda ids, j=j: self._capture(j, ids))

    def _capture(self, j: int, topk_ids: torch.Tensor) -> None:
        if self.enabled:
            self._step[j] = topk_ids.detach().to("cpu", copy=True)

    def _pre(self, _model: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        if not self.enabled:
            return
        positions = kwargs["positions"] if "positions" in kwargs else args[1]
        batch = self.runner.input_batch
        n = batch.num_reqs
        starts = [int(x) for x in self.runner.query_start_loc.np[:n + 1]]
        pos = positions if positions.dim() == 1 else positions[0]  # M-RoPE: text tokens share one position
        self._layout = (list(batch.req_ids[:n]), starts, pos[:starts[-1]].detach().to("cpu", copy=True))
        self._step = [None] * len(self.layers)

    def _post(self, *_: Any) -> None:
        if not self.enabled:
            return
        req_ids, starts, pos = self._layout
        if any(x is None for x in self._step):
            raise RuntimeError("capture_routes: a MoE layer's router did not report its experts in this step")
        ids = torch.stack(self._step, dim=1)  # [step tokens (maybe padded), moe layers, k]
        if ids.shape[0] < starts[-1]:
            raise RuntimeError(f"capture_routes: routers routed {ids.shape[0]} tokens, the step scheduled "
                               f"{starts[-1]}")
        for i, rid in enumerate(req_ids):
            a, b = starts[i], starts[i + 1]
            self.routes.setdefault(rid, []).append((pos[a:b], ids[a:b]))
        self._layout, self._step = None, []

    def take(self, req_id: str, length: int) -> list:
        """``[length, moe layers, k]`` expert ids of a request's positions ``0 .. length-1`` (-1: none
        computed), as nested lists; forgets the request. ``req_id`` is the id ``LLM.generate`` reports;
        the model runner knows the request by vLLM's internal id, that id plus ``-`` and 8 random
        characters (``InputProcessor.assign_request_id``)."""
        k = self.layers[0][1].router.top_k
        out = torch.full((length, len(self.layers), k), -1, dtype=torch.int64)
        keys = [key for key in self.routes if key == req_id or key.rsplit("-", 1)[0] == req_id]
        if len(keys) > 1:
            raise RuntimeError(f"capture_routes: request {req_id!r} matches several engine requests {keys}")
        for pos, ids in self.routes.pop(keys[0], []) if keys else []:
            keep = pos < length
            out[pos[keep].long()] = ids[keep].long()
        return out.tolist()


def install_route_capture(worker: Any) -> list[int]:
    """Create (once) or re-bind the worker's :class:`RouteCapture`; its MoE layers' decoder-layer ids."""
    capture = getattr(worker, "compactrl_routes", None)
    if capture is None:
        capture = worker.compactrl_routes = RouteCapture(worker.model_runner)
    else:
        capture.bind()
    return capture.layer_ids


def capture_start(worker: Any) -> None:
    capture = worker.compactrl_routes
    capture.routes.clear()
    capture.enabled = True


def capture_take(worker: Any, requests: list[tuple[str, int]]) -> list[list]:
    """Stop capturing; each ``(request id, length)``'s routes (:meth:`RouteCapture.take`); forget the rest."""
    capture = worker.compactrl_routes
    capture.enabled = False
    out = [capture.take(rid, n) for rid, n in requests]
    capture.routes.clear()
    return out


def _is_cpu(runner: Any) -> bool:
    device = getattr(runner, "device", None)
    return device is None or torch.device(device).type == "cpu"


def _perturb(worker: Any, name_part: str, scale: float) -> str:
    """Tests only: add ``scale`` to the first parameter whose name contains ``name_part``."""
    for name, p in worker.model_runner.model.named_parameters():
        if name_part in name:
            with torch.no_grad():
                p.add_(scale)
            return name
    raise ValueError(f"no engine parameter name contains {name_part!r}")


class Engine:
    """One ``vllm.LLM`` (in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and its weight version."""

    def __init__(self, llm_kwargs: dict[str, Any], version: int, capture_routes: bool = False) -> None:
        from vllm import LLM

        if capture_routes and not llm_kwargs.get("enforce_eager"):
            raise ValueError("capture_routes needs enforce_eager=True: a compiled model does not run the "
                             "routers' Python callbacks")
        t0 = time.perf_counter()
        self.llm = LLM(**llm_kwargs)
        self.route_layers: list[int] | None = None
        if capture_routes:
            (self.route_layers,) = self.llm.collective_rpc(install_route_capture)
        self.start_s = time.perf_counter() - t0
        self.version = version
        self.staged: list[tuple[str, torch.Tensor]] = []

    def _generate_captured(self, prompts: list[dict[str, Any]], params: list[Any]) -> tuple[list[Any], list | None]:
        """``llm.generate``; with route capture, also each request's ``[prompt + output, moe layers, k]`` ids."""
        if self.route_layers is None:
            return self.llm.generate(prompts, sampling_params=params, use_tqdm=False), None
        self.llm.collective_rpc(capture_start)
        try:
            outs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        except BaseException:
            self.llm.collective_rpc(capture_take, args=([],))  # stop capturing, forget the partial routes
            raise
        requests = [(o.request_id, len(o.prompt_token_ids) + len(o.outputs[0].token_ids)) for o in outs]
        (routes,) = self.llm.collective_rpc(capture_take, args=(requests,))
        return outs, routes

    def generate(self, prompts: list[list[int]], params: list[dict[str, Any]]) -> dict[str, Any]:
        from vllm import SamplingParams

        outs, captured = self._generate_captured([{"prompt_token_ids": p} for p in prompts],
                                                 [SamplingParams(**kw) for kw in params])
        results = []
        for j, o in enumerate(outs):
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {None if c.logprobs is None else len(c.logprobs)} log-prob "
                                   f"entries for {len(ids)} tokens (SamplingParams(logprobs=0) is required)")
            lps = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)]
            out = {"token_ids": ids, "log_probs": lps, "finish_reason": c.finish_reason}
            routed = getattr(c, "routed_experts", None)  # [tokens, layers, top-k] with enable_return_routed_experts
            if routed is not None:
                out["routed_experts"] = routed.tolist()
            if captured is not None:  # [prompt + output, moe layers, k], -1 where no step computed the token
                out["routed_experts"] = captured[j]
            results.append(out)
        return {"outputs": results, "version": self.version}

    def score(self, sequences: list[list[int]], params: dict[str, Any]) -> dict[str, Any]:
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, logprobs=0, detokenize=False, **params)
        outs = self.llm.generate([{"prompt_token_ids": s} for s in sequences], sampling_params=sp, use_tqdm=False)
        scores = []
        for seq, o in zip(sequences, outs):
            plp = o.prompt_logprobs
            if plp is None or len(plp) != len(seq):
                raise RuntimeError(f"vLLM returned {None if plp is None else len(plp)} prompt log-prob entries "
                                   f"for {len(seq)} tokens")
            scores.append([float(plp[t][tok].logprob) for t, tok in enumerate(seq) if t > 0])
        return {"log_probs": scores, "version": self.version}

    def stage(self, tensors: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        self.staged.extend((name, wire.decode_tensor(t)) for name, t in tensors)
        return {"staged": len(self.staged)}

    def commit(self, version: int, repack_experts: bool = True) -> dict[str, Any]:
        staged, self.staged = self.staged, []
        if not staged:
            raise ValueError("commit without staged weights")
        t0 = time.perf_counter()
        (timing,) = self.llm.collective_rpc(reload_weights, args=(staged,),
                                            kwargs={"repack_experts": repack_experts})
        if self.route_layers is not None:
            self.llm.collective_rpc(install_route_capture)  # the reload may rebuild the routers' kernels
        self.llm.reset_prefix_cache()
        self.version = int(version)
        return {"version": self.version, "tensors": len(staged), "load_s": time.perf_counter() - t0, **timing}

    def perturb(self, name_part: str, scale: float) -> dict[str, Any]:
        (name,) = self.llm.collective_rpc(_perturb, args=(name_part, scale))
        self.llm.reset_prefix_cache()
        return {"name": name}

    def info(self) -> dict[str, Any]:
        import vllm

        cfg = self.llm.llm_engine.model_config
        return {"pid": os.getpid(), "version": self.version, "vllm": vllm.__version__, "torch": torch.__version__,
                "max_model_len": int(cfg.max_model_len), "dtype": str(cfg.dtype).removeprefix("torch."),
                "start_s": self.start_s, "route_layers": self.route_layers}


def serve(sock: socket.socket) -> int:
    """Answer requests until ``shutdown`` or until the learner closes its end."""
    hello = wire.recv_msg(sock)
    if hello.get("op") != "start":
        raise ValueError(f"the first request must be 'start', got {hello.get('op')!r}")
    try:
        engine = Engine(hello["llm_kwargs"], int(hello.get("version", 0)), bool(hello.get("capture_routes")))
    except Exception as exc:  # noqa: BLE001 - reported to the learner, then exit
        wire.send_msg(sock, wire.error_answer(exc))
        return 1
    wire.send_msg(sock, {"ok": True, **engine.info()})
    ops = {"generate": engine.generate, "score": engine.score, "stage": engine.stage, "commit": engine.commit,
           "perturb": engine.perturb, "info": engine.info}
    while True:
        try:
            req = wire.recv_msg(sock)
        except EOFError:  # the learner went away: nothing left to serve
            return 0
        op = req.pop("op", None)
        if op == "shutdown":
            wire.send_msg(sock, {"ok": True})
            return 0
        if op not in ops:
            wire.send_msg(sock, {"ok": False, "error": f"ValueError: unknown op {op!r}", "traceback": ""})
            continue
        try:
            wire.send_msg(sock, {"ok": True, **ops[op](**req)})
        except Exception as exc:  # noqa: BLE001 - the learner raises it with the engine's traceback
            wire.send_msg(sock, wire.error_answer(exc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="file descriptor of the connected socket")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sock = socket.socket(fileno=args.fd)
    try:
        return serve(sock)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
