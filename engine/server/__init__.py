"""Servers in front of the engine: the OpenAI-compatible HTTP API (engine.server.openai, engine.server.serve)."""
