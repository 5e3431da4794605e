"""Terminal-Bench (1.x ``task.yaml`` and 2.x / Harbor ``task.toml`` folders): folders -> tasks
(:mod:`.folders`, :mod:`.spec`, :mod:`.files`), what a task's Dockerfile does (:mod:`.dockerfile`), its file
state replayed for the local sandbox (:mod:`.local_build`, :mod:`.downloads`, :mod:`.toolchains`) and
substitutes for its base images on a container engine (:mod:`.base_images`)."""
