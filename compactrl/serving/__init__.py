"""Serving: ``compactrl serve``, the OpenAI-compatible completions server, in four modules by concern (the
``/v1/completions`` formats :mod:`.completions`, the batching engines :mod:`.batching`, the HTTP server
:mod:`.server`, the command line :mod:`.cli`), and the vLLM engine in a process of its own
(:mod:`.vllm`). Policies sample; this package serves them and talks to engines."""
