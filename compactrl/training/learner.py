"""The learner: parameters, optimiser state, the update step, weight syncs and checkpoints, behind one
interface whatever the number of ranks.

* :class:`LocalLearner` (``learner.ranks=1``, the default): the policy and critic train in the trainer's
  process; the policy the rollouts sample with is the trained module itself.
* :class:`ShardedLearner` (``learner.ranks=N>1``): the policy and critic are FSDP2-sharded over N ranks
  (:mod:`compactrl.training.ranks`, on Ray or under ``torchrun``), data-parallel over the batch with
  the loss normalised by the whole batch's token count (:mod:`compactrl.training.update`). The
  trainer's process keeps an unsharded copy of the policy for sampling, evaluation and the final
  model; every sync gathers the ranks' parameters bucket by bucket into it and checks it on a probe
  batch against the ranks' own (sharded) log-probs, before any engine gets it.

Checkpoints of both are :mod:`torch.distributed.checkpoint` directories (model and optimiser state by
parameter name, each rank writing its shards), so a run saved at N ranks resumes at M.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from tensordict import TensorDict

from compactrl.training.config import TrainConfig
from compactrl.training.update import Updater

log = logging.getLogger(__name__)

__all__ = ["Learner", "LocalLearner", "ShardedLearner", "save_learner_state",
           "load_learner_state", "init_optimizer_state", "probe_tolerance", "state_mib", "LearnerSyncError"]


class LearnerSyncError(RuntimeError):
    """The weights gathered from the ranks do not score the probe batch as the ranks do."""


@runtime_checkable
class Learner(Protocol):
    """What the trainer asks of a learner, with one rank or many."""

    def advantages(self, batch: TensorDict) -> TensorDict:
        """Critic values (PPO) and advantages of ``batch``, written into it; returns it."""
        ...

    def update(self, batch: TensorDict, *, train_policy: bool = True, max_critic_steps: int | None = None,
               minibatches: int | None = None) -> dict[str, float]:
        """The update step on ``batch`` (see :meth:`~compactrl.training.update.Updater.update`); diagnostics."""
        ...

    def steps_per_batch(self) -> int:
        ...

    def sync(self, rollouts: Any, version: int) -> dict[str, float]:
        """Bring the sampling policy and every engine of ``rollouts`` to the learner's weights as ``version``."""
        ...

    def save(self, path: Path) -> dict[str, Any]:
        """Write the learner's state under the directory ``path``; returns the small rest for the checkpoint file."""
        ...

    def load(self, path: Path, extra: dict[str, Any]) -> None:
        """Read a state :meth:`save` wrote (at any number of ranks)."""
        ...

    def close(self) -> None:
        ...


# -- checkpoints (one format for every rank count) ------------------------------------------------------


def _pairs(policy, critic, updater: Updater) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
    pairs = {"policy": (policy.model, updater.opt)}
    if critic is not None:
        pairs["critic"] = (critic, updater.critic_opt)
    return pairs


@contextlib.contextmanager
def _one_process_quiet():
    """DCP warns that it assumes one process when no process group exists: that is the one-process learner."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save_learner_state(path: str | Path, policy, critic, updater: Updater) -> None:
    """Models and optimisers, by parameter name, into the DCP directory ``path`` (every rank its shards).

    An optimiser that has not stepped yet (its state is empty, e.g. the policy's at iteration 0) is not
    saved: ``get_state_dict`` would first give it a zero step to have something to save, which would
    shift Adam's bias correction of every later step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    state = {}
    for name, (module, opt) in _pairs(policy, critic, updater).items():
        if opt.state:
            state[f"{name}_model"], state[f"{name}_optim"] = get_state_dict(module, opt)
        else:
            state[f"{name}_model"] = get_model_state_dict(module)
    with _one_process_quiet():
        dcp.save(state, checkpoint_id=str(path))


def init_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create the optimiser's state with a step that changes nothing (lr 0, zero gradients), so that a
    checkpoint can load into it."""
    saved = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for g, lr in zip(opt.param_groups, saved):
        g["lr"] = lr


def load_learner_state(path: str | Path, policy, critic, updater: Updater) -> None:
    """Read :func:`save_learner_state`'s directory into these modules and optimisers, however they are sharded
    (an optimiser saved before its first step is left fresh)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    pairs = _pairs(policy, critic, updater)
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    with_optim = {name for name in pairs if any(k.startswith(f"{name}_optim.") for k in saved)}
    state = {}
    for name, (module, opt) in pairs.items():
        if name in with_optim:
            if not opt.state:
                init_optimizer_state(opt)  # DCP loads into existing tensors
            state[f"{name}_model"], state[f"{name}_optim"] = get_state_dict(module, opt)
        else:
            opt.state.clear()
            state[f"{name}_model"] = get_model_state_dict(module)
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=str(path))
    for name, (module, opt) in pairs.items():
        if name in with_optim:
            set_state_dict(module, opt, model_state_dict=state[f"{name}_model"],
                           optim_state_dict=state[f"{name}_optim"])
        else:
            set_model_state_dict(module, state[f"{name}_model"])


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def state_mib(policy, critic, updater: Updater) -> dict[str, float]:
    """MiB of parameters, gradients and optimiser state this process holds (its shards, when sharded)."""
    mods = [m for m in (policy, critic) if m is not None]
    params = [p for m in mods for p in m.parameters()]
    opts = [o for o in (updater.opt, updater.critic_opt) if o is not None]
    mib = float(1 << 20)
    return {"params_mib": sum(_local_bytes(p) for p in params) / mib,
            "grads_mib": sum(_local_bytes(p.grad) for p in params if p.grad is not None) / mib,
            "optimizer_mib": sum(_local_bytes(v) for o in opts for st in o.state.values() for v in st.values()
                                 if torch.is_tensor(v) and v.dim() > 0) / mib}


# -- one process -----------------------------------------------------------------------------------------


class LocalLearner:
    """The learner in the trainer's process: the rollouts sample with the trained policy itself."""

    def __init__(self, cfg: TrainConfig, policy, critic) -> None:
        self.policy, self.critic = policy, critic
        self.updater = Updater(cfg.rl, policy, critic, seed=cfg.seed + 2)

    def advantages(self, batch: TensorDict) -> TensorDict:
        return self.updater.advantages(batch)

    def update(self, batch: TensorDict, **kwargs: Any) -> dict[str, float]:
        return self.updater.update(batch, **kwargs)

    def steps_per_batch(self) -> int:
        return self.updater.steps_per_batch()

    def sync(self, rollouts: Any, version: int) -> dict[str, float]:
        rollouts.update_weights(self.policy, version=version)
        return {}

    def save(self, path: Path) -> dict[str, Any]:
        save_learner_state(path, self.policy, self.critic, self.updater)
        return {"generator": self.updater.generator.get_state()}

    def load(self, path: Path, extra: dict[str, Any]) -> None:
        load_learner_state(path, self.policy, self.critic, self.updater)
        self.updater.generator.set_state(extra["generator"])

    def memory(self) -> dict[str, float]:
        return state_mib(self.policy, self.critic, self.updater)

    def load_legacy(self, state: dict[str, Any]) -> None:
        """A checkpoint file that holds the learner's state itself (written before learner directories)."""
        self.policy.load_state_dict(state["policy"])
        self.updater.load_state_dict(state["updater"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    def close(self) -> None:
        pass


# -- N ranks ------------------------------------------------------------------------------------------------


class ShardedLearner:
    """The learner on ``learner.ranks`` FSDP2 ranks; ``policy`` is the trainer's unsharded sampling copy."""

    def __init__(self, cfg: TrainConfig, policy, ranks: Any) -> None:
        self.cfg, self.policy, self.ranks = cfg, policy, ranks
        self.probe = None

    def advantages(self, batch: TensorDict) -> TensorDict:
        batch.update(self.ranks.call("advantages", batch))
        return batch

    def update(self, batch: TensorDict, **kwargs: Any) -> dict[str, float]:
        return self.ranks.call("update", batch, kwargs)

    def steps_per_batch(self) -> int:
        return self.ranks.call("steps_per_batch")

    def probe_log_probs(self, sequences) -> list[list[float]]:
        """The probe batch scored by the ranks' own (sharded) weights."""
        return self.ranks.call("probe_log_probs", [list(map(int, s)) for s in sequences])

    def pull(self) -> dict[str, float]:
        """The ranks' parameters, gathered bucket by bucket, copied into the sampling policy."""
        t0 = time.perf_counter()
        params = dict(self.policy.model.named_parameters())
        plan = self.ranks.call("bucket_plan", int(self.cfg.learner.sync_bucket_mb * (1 << 20)))
        nbytes = 0
        with torch.no_grad():
            for i in range(len(plan)):
                for name, t in self.ranks.call("gather_bucket", i).items():
                    params[name].copy_(t)
                    nbytes += t.numel() * t.element_size()
        return {"learner/sync_buckets": float(len(plan)), "learner/sync_mb": nbytes / 1e6,
                "learner/gather_s": time.perf_counter() - t0}

    def check(self) -> dict[str, float]:
        """The sampling copy and the ranks score the probe batch alike, or :class:`LearnerSyncError`."""
        from compactrl.serving.vllm.policy import learner_log_probs, max_abs_diff, probe_sequences

        if self.probe is None:
            self.probe = probe_sequences(int(self.policy.model.config.vocab_size))
        t0 = time.perf_counter()
        worst, mean = max_abs_diff(learner_log_probs(self.policy.model, self.probe), self.probe_log_probs(self.probe))
        row = {"learner/probe_max_abs_dlogp": worst, "learner/probe_mean_abs_dlogp": mean,
               "learner/probe_s": time.perf_counter() - t0}
        bound = probe_tolerance(self.cfg)
        if not worst <= bound:
            raise LearnerSyncError(
                f"weight sync: the weights gathered from the {self.cfg.learner.ranks} learner ranks score the probe "
                f"batch up to {worst:.4g} (mean {mean:.4g}) away from the ranks' own log-probs (bound "
                f"{bound:g}); no rollout from these weights was used")
        return row

    def sync(self, rollouts: Any, version: int) -> dict[str, float]:
        row = {**self.pull(), **self.check()}
        rollouts.update_weights(self.policy, version=version, reference=self.probe_log_probs)
        return row

    def save(self, path: Path) -> dict[str, Any]:
        return self.ranks.call("save", str(path))

    def load(self, path: Path, extra: dict[str, Any]) -> None:
        self.ranks.call("load", str(path), extra)
        self.pull()
        self.check()  # the sampling copy scores like the restored ranks before any engine loads it

    def load_legacy(self, state: dict[str, Any]) -> None:
        raise ValueError(f"learner.ranks={self.cfg.learner.ranks}: this run's checkpoint holds a one-process learner "
                         "in an older format; resume it with learner.ranks=1")

    def memory(self) -> dict[str, float]:
        """Rank 0's bytes of parameters, gradients and optimiser state (MiB)."""
        return self.ranks.call("memory")

    def close(self) -> None:
        self.ranks.close()


def probe_tolerance(cfg: TrainConfig) -> float:
    """Largest |Δ log p| allowed between the gathered fp32 sampling copy and the ranks on the probe batch:
    1e-4 when the ranks compute in fp32 (the same arithmetic up to the order of a few sums), 0.1 when they
    compute in bf16 (``learner.mixed_precision``; the bound of a bf16 engine against an fp32 learner)."""
    mp = cfg.learner.mixed_precision
    return 0.1 if mp == "bf16" or (mp == "auto" and torch.cuda.is_available()) else 1e-4
