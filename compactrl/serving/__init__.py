"""Serving: the OpenAI-compatible completions server (:mod:`.server`) and the vLLM engine in a process of
its own (:mod:`.vllm`). Policies sample; this package serves them and talks to engines."""
