"""The OpenAI-compatible HTTP API: request/response models, validation, completions, chat, tokenize."""
