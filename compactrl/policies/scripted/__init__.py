"""Scripted policies: the oracles that solve generated code and terminal tasks (from the facts their
generator recorded), the random policy, the reference-solution policies (``gold``, ``noop``) that
validate a task set, and the demonstrators the supervised warm start imitates."""
