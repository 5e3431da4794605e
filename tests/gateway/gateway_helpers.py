"""Helpers for the gateway tests (imported by name: pytest puts this folder on sys.path)."""

import torch


def rescore_error(policy, prompt_ids, token_ids, log_probs, **kw) -> float:
    """max |recorded log-prob - log_prob(prompt + sampled ids)| over the sampled ids."""
    seq = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        lp, _ = policy.log_prob(seq, torch.ones_like(seq, dtype=torch.bool), **kw)
    got = lp[0, len(prompt_ids):]
    return float((got - torch.tensor(log_probs)).abs().max())


def masked_log_probs(policy, masks, prompt, ids, temperature=1.0) -> list[float]:
    """The log-prob of each sampled id under the model's distribution with the grammar's mask applied."""
    seq = torch.tensor([list(prompt) + list(ids)])
    with torch.no_grad():
        logits = policy.model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0].float()
    grammar, state, out = masks.grammar, masks.grammar.start, []
    for k, t in enumerate(ids):
        assert bool(masks.allowed(state)[t]), f"token {t} at {k} was not allowed"
        row = logits[len(prompt) + k - 1] / temperature
        out.append(float(torch.log_softmax(row.masked_fill(~masks.allowed(state), float("-inf")), -1)[t]))
        if t in masks.stop_ids:
            break
        state = grammar.feed(state, masks.text_of[t])
    return out
