"""A vLLM engine in a process and environment of its own: the protocol both sides speak (:mod:`.wire`), the
engine process's script (:mod:`.engine`), the learner's side that starts the process and sends it
requests (:mod:`.client`), and the policy that samples from it and syncs weights into it (:mod:`.policy`)."""
