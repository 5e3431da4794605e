"""The trainer's update step (``Updater``) on sessions recorded through the gateway: GAE over the trace
trees, one PPO update changes the policy, and a restored checkpoint takes the identical next step."""

from __future__ import annotations

import copy

import openai
import pytest
import torch

from compactrl.algos.tree_gae import tree_gae
from compactrl.gateway.collector import session_batch
from compactrl.gateway.recording import load_session
from compactrl.policies.critic import ValueModel
from compactrl.training.config import RLConfig
from compactrl.training.update import Updater

RL = RLConfig(lmbda=1.0, value_lmbda=1.0, epochs=1, minibatches=1, critic_updates=1, lr=1e-3, critic_lr=1e-3,
              truncation="terminal")
"""One critic step then one policy step per update, on the whole batch; gamma = lambda = 1."""


def _sessions(gateway, n: int = 2):
    sessions = []
    for k in range(n):
        name = f"train-{k}"
        c = openai.OpenAI(base_url=f"{gateway.url}/s/{name}/v1", api_key="none", max_retries=0)
        msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": f"task {k}"}]
        for turn in range(2):
            r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6)
            if turn == 0:  # a sub-agent (another conversation root) runs while the agent waits
                c.chat.completions.create(model="tiny", max_tokens=6, messages=[
                    {"role": "system", "content": "sub-agent"}, {"role": "user", "content": "look it up"}])
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "tool", "content": f"output {turn}"}]
        gateway.finish_session(name, float(k % 2))  # half succeed: advantages of both signs
        sessions.append(load_session(gateway.recorder.path(name)))
    return sessions


def _learner(policy, state=None):
    actor = copy.deepcopy(policy)
    critic = ValueModel.from_policy(actor, head_bias=0.5)  # a baseline between the outcomes
    updater = Updater(RL, actor, critic, seed=0)
    if state is not None:
        actor.load_state_dict(state["actor"])
        critic.load_state_dict(state["critic"])
        updater.load_state_dict(state["updater"])
    return actor, critic, updater


@pytest.mark.timeout(300)
def test_one_ppo_update_on_recorded_sessions_changes_the_policy_and_resumes(gateway, policy, tmp_path):
    sessions = _sessions(gateway)
    actor, critic, updater = _learner(policy)
    batch = updater.advantages(session_batch(sessions))
    assert batch["parent_trace"].tolist().count(0) == 2  # each session's sub-agent: a child trace
    # the update step's advantages are GAE over the trace trees (before whitening)
    expected = tree_gae(batch.clone(), gamma=1.0, lmbda=1.0, value_lmbda=1.0, truncation="terminal")
    mask = batch["policy_mask"]
    assert torch.allclose(batch["value_target"][mask], expected["value_target"][mask], atol=1e-6)
    raw = expected["advantage"][mask]
    assert torch.allclose(batch["advantage"][mask], (raw - raw.mean()) / raw.std().clamp(min=1e-8), atol=1e-4)
    adv = batch["advantage"][mask]
    assert bool((adv > 0).any()) and bool((adv < 0).any())
    with torch.no_grad():
        before, _ = actor.log_prob(batch["tokens"], batch["attention_mask"])
    # the recorded log-probs are the current policy's: the first ratio is 1
    assert float((before[mask] - batch["sample_log_prob"][mask]).abs().max()) < 1e-4
    stats = updater.update(batch)
    assert stats["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    with torch.no_grad():
        after, _ = actor.log_prob(batch["tokens"], batch["attention_mask"])
    assert float((after[mask] - before[mask]).abs().max()) > 1e-4
    # resumable: a checkpoint restored into fresh objects takes the same next step
    path = tmp_path / "state.pt"
    torch.save({"actor": actor.state_dict(), "critic": critic.state_dict(), "updater": updater.state_dict()}, path)
    actor2, critic2, updater2 = _learner(policy, torch.load(path, weights_only=False))
    updater.update(batch)
    updater2.update(batch)
    for (k, a), b in zip([*actor.state_dict().items(), *critic.state_dict().items()],
                         [*actor2.state_dict().values(), *critic2.state_dict().values()]):
        assert torch.equal(a, b), k


def test_unfinished_sessions_are_refused():
    from compactrl.gateway.recording import Session

    with pytest.raises(ValueError, match="unfinished"):
        session_batch([Session("open", [], None, {})])
