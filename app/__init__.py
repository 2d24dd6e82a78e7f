"""Kestrel's desktop app (PySide6). It talks to the engine only through engine.frontend.client, from worker threads;
widgets receive results as queued Qt signals. Nothing on the start-up path imports torch."""
