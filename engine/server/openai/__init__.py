"""OpenAI-compatible API: app (FastAPI factory), protocol (models), serving_chat / serving_completions."""
