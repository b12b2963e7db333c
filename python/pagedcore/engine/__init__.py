"""The engine: KV cache sizing, the model runner and the step loop around the C++ scheduler."""
