"""Training: the configuration tree (:mod:`.config`), the loop (:mod:`.trainer`) with its phases
(:mod:`.sft`, :mod:`.update`), the run directory (:mod:`.run_dir`) and ``compactrl train`` (:mod:`.cli`).
The maths it runs (advantages, losses, packing) is in :mod:`compactrl.algos`."""
