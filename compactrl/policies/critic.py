"""The critic: the policy's architecture with a scalar value head.

``ValueModel.from_policy(policy)`` deep-copies the policy's transformer trunk (everything but the LM
head) and adds a linear value head; ``share_trunk=True`` reuses the policy's trunk instead, so only
the head is new. ``value(tokens, attention_mask)[:, t]`` is V(state before token t), read from the
hidden state at ``t - 1`` so that it lines up with ``TransformersPolicy.log_prob``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from compactrl.policies.transformers_policy import (
    TransformersPolicy,
    checkpointing_engaged,
    enable_activation_checkpointing,
    positions_from_mask,
    router_aux_loss,
)


def _trunk_of(model: nn.Module) -> nn.Module:
    """The decoder stack of a Hugging Face causal LM (``model.model`` for these architectures)."""
    trunk = getattr(model, "base_model", None)
    if trunk is None or trunk is model:
        raise ValueError(f"{type(model).__name__} has no separate base model to use as a critic trunk")
    return trunk


class ValueModel(nn.Module):
    """A value function over token prefixes.

    With a shared trunk the trunk is *not* registered as a submodule: ``parameters()`` and
    ``state_dict()`` hold the head only (the trunk is trained and saved with the policy), so an
    optimiser over ``policy.parameters()`` plus ``critic.parameters()`` sees every weight once.
    """

    def __init__(self, trunk: nn.Module, hidden_size: int, *, share_trunk: bool = False,
                 head_init_std: float = 0.0, head_bias: float = 0.0, activation_checkpointing: bool = False) -> None:
        super().__init__()
        if head_init_std < 0:
            raise ValueError(f"head_init_std must be >= 0, got {head_init_std}")
        self.share_trunk = share_trunk
        if share_trunk:
            self._shared = (trunk,)  # a tuple hides it from nn.Module registration
        else:
            self.trunk_module = trunk
        self.head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        # a zero head starts at V = head_bias everywhere: no state-dependent bias in the first advantages
        nn.init.normal_(self.head.weight, std=head_init_std) if head_init_std > 0 else nn.init.zeros_(self.head.weight)
        nn.init.constant_(self.head.bias, float(head_bias))
        if activation_checkpointing:  # a shared trunk is the policy's: its layers are checkpointed for both
            enable_activation_checkpointing(trunk)

    @classmethod
    def from_policy(cls, policy, *, share_trunk: bool = False, head_init_std: float = 0.0,
                    head_bias: float = 0.0, activation_checkpointing: bool = False) -> ValueModel:
        """A critic initialised from a ``TransformersPolicy`` or a Hugging Face causal LM (its trunk as
        it is now, e.g. after SFT); the value head starts at ``head_bias`` everywhere (zero weights
        unless ``head_init_std``). ``activation_checkpointing``: the trunk's decoder layers recompute
        their activations in the backward instead of keeping them."""
        model = policy.model if isinstance(policy, TransformersPolicy) else policy
        trunk = _trunk_of(model)
        if not share_trunk:
            trunk = copy.deepcopy(trunk)
            if not activation_checkpointing:  # the copy would keep a checkpointed policy's setting
                enable_activation_checkpointing(trunk, False)
        return cls(trunk, int(model.config.hidden_size), share_trunk=share_trunk, head_init_std=head_init_std,
                   head_bias=head_bias, activation_checkpointing=activation_checkpointing)

    @property
    def trunk(self) -> nn.Module:
        return self._shared[0] if self.share_trunk else self.trunk_module

    def value(self, tokens: torch.Tensor, attention_mask: torch.Tensor, *, return_aux_loss: bool = False):
        """``out[:, t]`` = V(tokens[:, :t]) from the hidden state at ``t - 1``; 0 at t=0 and padding."""
        if tokens.shape != attention_mask.shape or tokens.dim() != 2:
            raise ValueError(f"tokens and attention_mask must both be [N, L], got {tuple(tokens.shape)} "
                             f"and {tuple(attention_mask.shape)}")
        mask = attention_mask.long()
        with checkpointing_engaged(self.trunk):
            out = self.trunk(input_ids=tokens, attention_mask=mask, position_ids=positions_from_mask(mask),
                             use_cache=False, output_router_logits=return_aux_loss)
        v = self.head(out.last_hidden_state[:, :-1].float()).squeeze(-1)
        keep = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
        v = torch.cat([v.new_zeros(tokens.shape[0], 1), v.masked_fill(~keep, 0.0)], dim=1)
        if return_aux_loss:
            return v, router_aux_loss(self.trunk, getattr(out, "router_logits", None), mask)
        return v

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        return self.value(tokens, attention_mask, **kwargs)
