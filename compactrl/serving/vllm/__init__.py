"""A vLLM engine in a process and environment of its own: the engine script (:mod:`.engine`) and the
learner-side policy that starts it, samples from it and syncs weights into it (:mod:`.policy`)."""
