"""One PPO update on sessions recorded through the gateway changes the policy, and resumes exactly."""

from __future__ import annotations

import copy

import openai
import pytest
import torch

from compactrl.algos.config import CriticPPOConfig
from compactrl.algos.losses import CriticPPOLoss
from compactrl.gateway.recording import load_session
from compactrl.gateway.training import ppo_update, session_batch
from compactrl.policies.critic import ValueModel


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
    opt = torch.optim.AdamW([*actor.parameters(), *critic.parameters()], lr=1e-3)
    if state is not None:
        actor.load_state_dict(state["actor"])
        critic.load_state_dict(state["critic"])
        opt.load_state_dict(state["optimizer"])
    return actor, critic, opt


@pytest.mark.timeout(300)
def test_one_ppo_update_on_recorded_sessions_changes_the_policy_and_resumes(gateway, policy, tmp_path):
    sessions = _sessions(gateway)
    actor, critic, opt = _learner(policy)
    loss = CriticPPOLoss(actor, critic, CriticPPOConfig())
    batch = session_batch(sessions, critic)
    assert batch["parent_trace"].tolist().count(0) == 2  # each session's sub-agent: a child trace
    adv = batch["advantage"][batch["policy_mask"]]
    assert bool((adv > 0).any()) and bool((adv < 0).any())
    with torch.no_grad():
        before, _ = actor.log_prob(batch["tokens"], batch["attention_mask"])
    # the recorded log-probs are the current policy's: the first ratio is 1
    mask = batch["policy_mask"]
    assert float((before[mask] - batch["sample_log_prob"][mask]).abs().max()) < 1e-4
    stats = ppo_update(loss, opt, batch)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    with torch.no_grad():
        after, _ = actor.log_prob(batch["tokens"], batch["attention_mask"])
    assert float((after[mask] - before[mask]).abs().max()) > 1e-4
    # resumable: a checkpoint restored into fresh objects takes the same next step
    path = tmp_path / "state.pt"
    torch.save({"actor": actor.state_dict(), "critic": critic.state_dict(), "optimizer": opt.state_dict()}, path)
    actor2, critic2, opt2 = _learner(policy, torch.load(path))
    ppo_update(loss, opt, batch)
    ppo_update(CriticPPOLoss(actor2, critic2, CriticPPOConfig()), opt2, batch)
    for (k, a), b in zip(actor.state_dict().items(), actor2.state_dict().values()):
        assert torch.equal(a, b), k
