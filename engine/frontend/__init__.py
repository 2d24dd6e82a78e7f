"""The engine's front end, in the process that uses the engine (the app's worker thread, ``kestrel serve``):
EngineClient (client.py) sends requests to the engine process and routes its outputs into RequestStreams
(request_stream.py); the engine's tokenizer rebuilt on this side (tokenizer.py) tokenizes prompts off the engine's
loop; EngineSupervisor (supervisor.py) spawns the engine process (``python -m engine.core.process``), watches it
and restarts it. The messages both sides exchange are engine.wire's, below both."""
