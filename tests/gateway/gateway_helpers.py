"""Helpers for the gateway tests (imported by name: pytest puts this folder on sys.path)."""

import torch


def rescore_error(policy, prompt_ids, token_ids, log_probs, **kw) -> float:
    """max |recorded log-prob - log_prob(prompt + sampled ids)| over the sampled ids."""
    seq = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        lp, _ = policy.log_prob(seq, torch.ones_like(seq, dtype=torch.bool), **kw)
    got = lp[0, len(prompt_ids):]
    return float((got - torch.tensor(log_probs)).abs().max())
