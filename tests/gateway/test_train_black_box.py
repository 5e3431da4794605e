"""``compactrl train`` with the black-box source: mini-swe-agent episodes through the in-process gateway
are the training batches; one PPO iteration changes the policy and ``--resume`` extends the run by one more."""

from __future__ import annotations

import argparse

import pytest
import torch
from gymnasium.utils import seeding

from compactrl.gateway.mini_swe import offline_environment
from compactrl.gateway.recording import load_session
from compactrl.sandbox import SandboxError, make_sandbox
from compactrl.tokenizer import shared_tokenizer
from compactrl.training import cli as train_cli
from compactrl.training.config import TrainConfig, override, preset
from compactrl.training.rollouts import build_policy, make_env_fns
from compactrl.training.run_dir import RunDir

offline_environment()
pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (pip install -e '.[test]')")

ARGS = ["--preset", "smoke", "--no-progress", "--no-sft.enabled", "--rollout.source", "mini_swe_agent",
        "--env.backend", "local", "--rollout.action_regex", r"\A\s*([^\n]+)", "--rollout.command_timeout_s", "3",
        "--env.context_budget.budget", "1400", "--env.max_turns", "5", "--rl.iterations", "1",
        "--rl.critic_pretrain_steps", "0", "--eval.episodes", "0", "--model.critic_head_init", "0.5"]
"""The smoke preset (tiny model, 2 episodes per iteration, 2 at a time) with the black-box source: the
agent's first response line is its command (the tiny model cannot write a fenced block), 5 calls per
episode, compacting above 1400 - 16 tokens (default.yaml's system + task take ~1170). The random model
solves no task: a critic that starts at 0.5 gives its 0-reward tokens advantages of both signs after
whitening (a zero critic would give all-zero advantages and no policy gradient)."""


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    return train_cli.run(parser.parse_args(argv))


def _require_sandbox() -> None:
    env = make_env_fns(override(preset("smoke"), {"env.backend": "local"}).env, split="train", count=1)[0]()
    sandbox = make_sandbox("local")
    try:
        sandbox.start(env.unwrapped.task_source.sample(seeding.np_random(0)[0]))
    except (SandboxError, OSError) as exc:
        pytest.skip(f"the local sandbox needs bubblewrap or unshare with user namespaces: {exc}")
    finally:
        sandbox.close()
        env.close()


def _changed(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(600)
def test_train_on_mini_swe_agent_sessions_changes_the_policy_and_resumes(tmp_path):
    _require_sandbox()
    out = tmp_path / "run"
    assert _cli([*ARGS, "--out", str(out)]) == 0
    run = RunDir(out)
    cfg = TrainConfig.from_dict(run.read_config())
    assert cfg.rollout.source == "mini_swe_agent" and not cfg.sft.enabled
    rows = run.rows()
    assert [r["iteration"] for r in rows] == [0, 1]
    assert rows[1]["train/episodes"] == 2.0 and rows[1]["train/sandbox_errors"] == 0.0
    assert rows[1]["train/traces_per_episode"] > 1  # the agent compacted: chains of traces
    assert rows[1]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # recorded log-probs are the policy's
    first = run.load_checkpoint()
    assert first["iteration"] == 1 and first["collector"]["next_episode_id"] == 2
    initial, _ = build_policy(cfg, shared_tokenizer())  # no SFT: the run started from the seeded init
    first = {**first, **_learner_state(run, first)}
    assert _changed(initial.state_dict(), first["policy"])

    assert _cli(["--resume", "--out", str(out), "--no-progress", "--rl.iterations", "2"]) == 0
    rows = run.rows()
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    second = run.load_checkpoint()
    second = {**second, **_learner_state(run, second)}
    assert second["iteration"] == 2 and second["collector"]["next_episode_id"] == 4
    assert _changed(first["policy"], second["policy"]) and _changed(first["critic"], second["critic"])
    # each iteration's episodes were sampled by the weights of that iteration (version = updates before it)
    sessions = {p.name: load_session(p) for p in sorted((out / "sessions").glob("*.jsonl"))}
    assert sorted(sessions) == [f"episode-{i}.jsonl" for i in range(4)]
    versions = [{c.policy_version for c in sessions[f"episode-{i}.jsonl"].calls} for i in range(4)]
    assert versions == [{0}, {0}, {1}, {1}]
    assert all(s.finished for s in sessions.values())


@pytest.mark.parametrize("change, field", [
    ({}, "env.backend"),  # the smoke preset's sim backend cannot run the agent's shell commands
    ({"env.backend": "local", "rl.frozen_summarizer": True}, "rl.frozen_summarizer"),
    ({"env.backend": "local", "distributed.num_rollout_workers": 2}, "distributed.num_rollout_workers"),
    ({"env.backend": "local", "rollout.action_regex": "(unclosed"}, "rollout.action_regex"),
])
def test_a_black_box_config_that_cannot_run_is_a_value_error_naming_the_field(change, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        override(preset("smoke"), {"rollout.source": "mini_swe_agent", **change})


def _learner_state(run, checkpoint) -> dict:
    """``policy`` and ``critic`` weights (Hugging Face names, trunk names) from the checkpoint's learner directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = run.learner_dir(checkpoint["learner_dir"])
    out = path.parent / (path.name + ".pt")
    dcp_to_torch_save(str(path), str(out))
    flat = __import__("torch").load(out, weights_only=False)
    assert dcp  # the format the learner writes
    return {"policy": flat["policy_model"], "critic": flat.get("critic_model", {})}
