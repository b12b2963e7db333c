"""The engine: the step loop around the C++ scheduler (llm_engine), the owner of request state
(request_registry), the worker boundary (step_input, worker), KV cache sizing, and the read-only view."""
