"""The learner's ranks: one :class:`RankWorker` per process, FSDP2-sharded policy and critic, started on
Ray (:class:`RayRanks`) or by ``torchrun`` (:class:`TorchrunRanks`).

A :class:`RankWorker` holds its shard of the policy and the critic (each decoder layer, then the whole
module, wrapped with ``fully_shard``), their optimisers and the same
:class:`~compactrl.training.update.Updater` one process uses, told its :class:`~compactrl.training.update.Shard`.
Every method is a collective: every rank runs it with the same arguments, and rank 0's answer is the
learner's. The two transports only differ in how the call reaches every rank:

* :class:`RayRanks`: one actor per rank in a placement group (one CPU, or one GPU, per bundle); the
  trainer's process is not a rank, and calls every actor;
* :class:`TorchrunRanks`: the processes ``torchrun`` started; rank 0 runs the trainer and sends each
  call to the other ranks (``broadcast_object_list`` over the ranks' group), which run :func:`follow`
  until it says ``close``.

The weights the ranks start from are rank 0's, broadcast once (each rank holds the full model for
that moment before sharding it; a model that does not fit one device would be built on the meta
device and loaded shard by shard, which this module does not do). A weight sync never holds more
than one bucket of gathered tensors beyond the rank's own shard (:meth:`RankWorker.gather_bucket`).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from typing import Any

import torch
from tensordict import TensorDict

from compactrl.training.config import TrainConfig
from compactrl.training.update import Shard, Updater

log = logging.getLogger(__name__)

__all__ = ["make_learner", "RankWorker", "RayRanks", "TorchrunRanks", "follow", "free_port", "under_torchrun", "mixed_precision_policy",
           "shard_module", "LearnerRankError"]

class LearnerRankError(RuntimeError):
    """A learner rank failed or died: the learner is stopped; the run resumes from its last checkpoint."""


def under_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (its rendezvous variables are set)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (for the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def mixed_precision_policy(cfg: TrainConfig, cuda: bool):
    """FSDP2's mixed precision for ``learner.mixed_precision``: bf16 parameters and fp32 gradient reduction
    where asked (``auto``: on CUDA), else full precision."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    want = cfg.learner.mixed_precision
    if want == "bf16" or (want == "auto" and cuda):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_module(module: torch.nn.Module, layers, mp, *, methods: tuple[str, ...] = ()) -> None:
    """FSDP2: each of ``layers`` a unit, then ``module`` (the rest: embeddings, norms, heads) the root;
    ``methods`` of ``module`` run through the root's hooks like ``forward``."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(module, mp_policy=mp)
    for name in methods:
        register_fsdp_forward_method(module, name)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class RankWorker:
    """One learner rank. :meth:`setup` joins the process group and builds the shards; the rest are the
    learner's operations (collectives: every rank calls them with the same arguments)."""

    def __init__(self) -> None:
        self.rank, self.world = 0, 1
        self.updater: Updater | None = None
        self._plan: list[list[str]] = []
        self._corrupt_next_sync = False

    # -- start --------------------------------------------------------------------------------------

    def rendezvous(self) -> str:
        """An ``init_method`` on this rank's node (rank 0's is the group's): its address and a free port."""
        import ray

        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        return f"tcp://{host}:{free_port(host)}"

    def setup(self, cfg_json: str, rank: int, world: int, init_method: str | None, weights: Any = None) -> bool:
        """Join the group, build the policy (rank 0's ``weights``, broadcast) and critic, shard both."""
        import torch.distributed as dist

        from compactrl.tokenizer import shared_tokenizer
        from compactrl.training.rollouts import build_policy

        cfg = TrainConfig.from_dict(json.loads(cfg_json))
        self.cfg, self.rank, self.world = cfg, rank, world
        cuda = torch.cuda.is_available()
        if not dist.is_initialized():
            kwargs = {"init_method": init_method} if init_method else {}
            dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=max(cfg.learner.start_timeout_s, 600)),
                                    **kwargs)
        self.device = torch.device("cpu")
        if cuda:  # under torchrun LOCAL_RANK names the GPU; a Ray actor sees only the GPU it was given
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            self.device = torch.device("cuda", torch.cuda.current_device())
        with torch.random.fork_rng(devices=[]):  # the trainer's process may be rank 0: keep its RNG as it was
            policy, _ = build_policy(cfg, shared_tokenizer())
        policy.model.to(self.device)
        with torch.no_grad():
            own = policy.model.state_dict()
            for name, t in own.items():
                if rank == 0 and weights is not None:
                    t.copy_(weights[name])
                dist.broadcast(t, src=0)
        critic = None
        if cfg.rl.algo == "ppo":  # as the trainer's critic: the policy's trunk, a value head at critic_head_init
            from compactrl.policies.critic import ValueModel

            critic = ValueModel.from_policy(policy, head_bias=cfg.model.critic_head_init,
                                            activation_checkpointing=cfg.learner.activation_checkpointing)
        mp = mixed_precision_policy(cfg, cuda)
        shard_module(policy, policy.model.base_model.layers, mp, methods=("log_prob",))
        if critic is not None:
            shard_module(critic, critic.trunk.layers, mp, methods=("value",))
        self.policy, self.critic = policy, critic
        self.updater = Updater(cfg.rl, policy, critic, seed=cfg.seed + 2, shard=Shard(rank, world, None))
        return True

    # -- the update ----------------------------------------------------------------------------------

    def advantages(self, batch: TensorDict) -> TensorDict | None:
        """Critic values (each rank its rows) and the advantages of the whole batch; rank 0 sends the new
        entries back."""
        before = set(batch.keys())
        out = self.updater.advantages(batch.to(self.device))
        if self.rank:
            return None
        return out.select(*[k for k in out.keys() if k not in before or k == "value"]).cpu()

    def update(self, batch: TensorDict, kwargs: dict[str, Any]) -> dict[str, float]:
        return self.updater.update(batch.to(self.device), **kwargs)

    def steps_per_batch(self) -> int:
        return self.updater.steps_per_batch()

    # -- weights out ----------------------------------------------------------------------------------

    def bucket_plan(self, max_bytes: int) -> list[list[str]]:
        """The policy's parameters (Hugging Face names) grouped in buckets of at most ``max_bytes`` of
        full tensors (a larger tensor goes alone); the same plan on every rank."""
        plan: list[list[str]] = []
        size = 0
        for name, p in self.policy.model.named_parameters():
            nbytes = p.numel() * p.element_size()
            if not plan or (plan[-1] and size + nbytes > max_bytes):
                plan.append([])
                size = 0
            plan[-1].append(name)
            size += nbytes
        self._plan = plan
        return plan

    def gather_bucket(self, index: int) -> dict[str, torch.Tensor] | None:
        """Bucket ``index`` of the last plan as full tensors (every rank takes part; rank 0 returns them)."""
        params = dict(self.policy.model.named_parameters())
        with torch.no_grad():
            out = {name: _full(params[name].detach()).float().cpu() for name in self._plan[index]}
        if self._corrupt_next_sync and self.rank == 0 and index == 0:  # fault injection, for the sync check's tests
            name = next(iter(out))
            out[name] = out[name] + 0.5
            self._corrupt_next_sync = False
        return out if self.rank == 0 else None

    def corrupt_next_sync(self) -> bool:
        """Fault injection: rank 0 adds 0.5 to the first tensor of the next sync's first bucket."""
        self._corrupt_next_sync = True
        return True

    @torch.no_grad()
    def probe_log_probs(self, sequences: list[list[int]]) -> list[list[float]] | None:
        """``log p(seq[t] | seq[:t])`` for ``t >= 1`` with the sharded weights (temperature 1, no truncation)."""
        out = []
        for seq in sequences:
            ids = torch.tensor([list(seq)], device=self.device)
            lp, _ = self.policy.log_prob(ids, torch.ones_like(ids), temperature=1.0, top_k=0, top_p=1.0)
            out.append(lp[0, 1:].float().tolist())
        return out if self.rank == 0 else None

    def grads(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """The last step's full gradients of the policy (Hugging Face names) and the critic, on rank 0."""
        out = {}
        for key, module in (("policy", self.policy.model), ("critic", self.critic)):
            if module is not None:
                out[key] = {n: _full(p.grad).detach().clone() for n, p in module.named_parameters() if p.grad is not None}
        return out if self.rank == 0 else None

    def memory(self) -> dict[str, float]:
        """This rank's parameters, gradients and optimiser state (its shards), in MiB."""
        from compactrl.training.learner import state_mib

        return state_mib(self.policy, self.critic, self.updater)

    # -- checkpoints ------------------------------------------------------------------------------------

    def save(self, path: str) -> dict[str, Any] | None:
        """Write the shards (policy, critic, optimisers) to the DCP directory ``path``; rank 0 returns the rest
        of the learner's state (the minibatch generator)."""
        from compactrl.training.learner import save_learner_state

        save_learner_state(path, self.policy, self.critic, self.updater)
        return {"generator": self.updater.generator.get_state()} if self.rank == 0 else None

    def load(self, path: str, extra: dict[str, Any]) -> bool:
        """Read a learner checkpoint saved at any number of ranks into these shards."""
        from compactrl.training.learner import load_learner_state

        load_learner_state(path, self.policy, self.critic, self.updater)
        self.updater.generator.set_state(extra["generator"])
        return True

    def close(self) -> bool:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        return True


# -- transports -------------------------------------------------------------------------------------------


class RayRanks:
    """``ranks`` :class:`RankWorker` actors in one placement group (one CPU each; one GPU each where the
    cluster has them); the trainer's process calls them all. Without a running Ray, a private local
    one (as ``compactrl train --ray`` starts) is started here and stopped by :meth:`close`."""

    def __init__(self, cfg: TrainConfig, weights: dict[str, torch.Tensor]) -> None:
        import contextlib

        import ray

        self._own_ray = contextlib.ExitStack()
        if not ray.is_initialized():
            from compactrl.distributed import local_ray

            log.info("learner.ranks=%d: starting a local Ray for the ranks", cfg.learner.ranks)
            self._own_ray.enter_context(local_ray(max(cfg.learner.ranks, os.cpu_count() or 1)))
        try:
            self._start(cfg, weights)
        except BaseException:
            self.close()
            raise

    def _start(self, cfg: TrainConfig, weights: dict[str, torch.Tensor]) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = cfg.learner.ranks
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= n else 0
        bundle = {"CPU": 1, **({"GPU": 1} if gpus else {})}
        self.pg = placement_group([bundle] * n, strategy="PACK")
        timeout = cfg.learner.start_timeout_s
        if not self.pg.wait(timeout):
            raise RuntimeError(f"learner.ranks={n}: Ray could not place {n} rank(s) of {bundle} within "
                               f"learner.start_timeout_s={timeout:g} s (it has {ray.available_resources()})")
        actor = ray.remote(num_cpus=1, num_gpus=gpus)(RankWorker)
        env = {"OMP_NUM_THREADS": str(max(1, cfg.threads // n))}
        self.actors = [actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, i),
                                     runtime_env={"env_vars": env}).remote() for i in range(n)]
        init = ray.get(self.actors[0].rendezvous.remote(), timeout=timeout)
        ref = ray.put(weights)
        cfg_json = cfg.to_json()
        ray.get([a.setup.remote(cfg_json, i, n, init, ref if i == 0 else None) for i, a in enumerate(self.actors)],
                timeout=timeout)

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method`` on every rank; rank 0's answer. A rank that fails or dies stops every rank at once
        (the others would wait in a collective until the group's timeout) and raises :class:`LearnerRankError`."""
        import ray

        if not self.actors:
            raise LearnerRankError("the learner's ranks are closed")
        refs = [ray.put(a) if isinstance(a, TensorDict) else a for a in args]  # one copy for every rank
        calls = [getattr(actor, method).remote(*refs) for actor in self.actors]
        pending = list(calls)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - any failure of a rank ends the learner
                rank = calls.index(done[0])
                self.close(graceful=False)
                raise LearnerRankError(f"learner rank {rank} failed in {method}: {type(exc).__name__}: "
                                       f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}") from exc
        return ray.get(calls[0])

    def close(self, *, graceful: bool = True) -> None:
        """Leave the process group and end every rank (``graceful=False``: end them at once, as after a
        failure, when the others may be waiting in a collective for a dead one)."""
        import ray

        for a in getattr(self, "actors", []):
            if graceful:
                try:
                    ray.get(a.close.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - a dead rank has nothing to close
                    log.debug("a learner rank did not close cleanly", exc_info=True)
            ray.kill(a)
        self.actors = []
        if getattr(self, "pg", None) is not None:
            ray.util.remove_placement_group(self.pg)
            self.pg = None
        self._own_ray.close()


class TorchrunRanks:
    """Rank 0 of a ``torchrun`` launch: runs every call here and sends it to the other ranks first."""

    def __init__(self, cfg: TrainConfig, weights: dict[str, torch.Tensor]) -> None:
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.learner.ranks:
            raise ValueError(f"learner.ranks: expected the torchrun world size {world}, got {cfg.learner.ranks}")
        if int(os.environ["RANK"]) != 0:
            raise RuntimeError("TorchrunRanks runs on rank 0; the other ranks run follow()")
        self.worker = RankWorker()
        self._send(["setup", [cfg.to_json(), None, world, None, None]])
        self.worker.setup(cfg.to_json(), 0, world, None, weights)

    def _send(self, message: list) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():  # rank 0 joins here; the followers joined in follow()
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        dist.broadcast_object_list([message], src=0)

    def call(self, method: str, *args: Any) -> Any:
        self._send([method, list(args)])
        return getattr(self.worker, method)(*args)

    def close(self) -> None:
        if getattr(self, "worker", None) is not None:
            self._send(["close", []])
            self.worker.close()
            self.worker = None


def follow() -> None:
    """Ranks 1..N-1 of a ``torchrun`` launch: run rank 0's calls until it closes the learner."""
    import torch.distributed as dist

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    worker = RankWorker()
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        method, args = box[0]
        if method == "setup":
            args = [args[0], rank, world, None, None]
        if method == "close":
            worker.close()
            return
        getattr(worker, method)(*args)


def make_learner(cfg: TrainConfig, policy, critic):
    """The learner ``cfg.learner`` asks for, starting from ``policy`` (and ``critic``) as they are now."""
    if cfg.learner.ranks == 1:
        from compactrl.training.learner import LocalLearner

        return LocalLearner(cfg, policy, critic)
    launcher = cfg.learner.launcher
    if launcher == "auto":
        launcher = "torchrun" if under_torchrun() else "ray"
    weights = {k: v.detach().cpu() for k, v in policy.model.state_dict().items()}
    ranks = TorchrunRanks(cfg, weights) if launcher == "torchrun" else RayRanks(cfg, weights)
    from compactrl.training.learner import ShardedLearner

    learner = ShardedLearner(cfg, policy, ranks)
    log.info("learner: %d FSDP2 ranks (%s)", cfg.learner.ranks, launcher)
    return learner
