"""The engine's front end, in the process that uses the engine (the app's worker thread, ``kestrel serve``):
EngineClient (client.py) sends requests to the engine process and routes its outputs into RequestStreams
(request_stream.py); the engine's tokenizer rebuilt on this side (tokenizer.py) tokenizes prompts off the engine's
loop; EngineSupervisor (supervisor.py) spawns the engine process (``python -m engine.core.process``), watches it
and restarts it. The messages both sides exchange are engine.wire's, below both.

EngineClient's API (all coroutines run on the event loop the client was started on; from another thread use
``asyncio.run_coroutine_threadsafe(coro, client.loop)``)::

    client = await EngineClient.start(EngineConfig(model=None, dtype="float32"),
                                      on_progress=lambda stage, detail: ...)   # waits until loaded
    client.info                        # ModelInfo: name, path, max_model_len, dtype, device, vocab_size,
                                       # generation_config, has_chat_template, num_kv_blocks, block_size, ...
    async for d in client.generate(prompt="Hi", params=SamplingParams(max_tokens=32)):
        d.index, d.text, d.token_ids, d.logprobs, d.finished, d.finish_reason, d.time, d.metrics
    # or, with control over the request:
    stream = await client.add_request(messages=[{"role": "user", "content": "Hi"}], params=SamplingParams(n=2))
    n_prompt = await stream.accepted()  # validated and queued by the engine (raises its typed error if not)
    while batch := await stream.next_batch():  # every delta received so far, at least one; [] at the end
        ...
    stream.abort()                     # frees its KV blocks in the engine (also on leaving `async with stream`)
    await client.abort(request_id)
    await client.stats()               # EngineStats: running / waiting, KV use, free blocks, prefix-cache hit
                                       # rate, prompt and generation tokens (totals and per second), recent steps
    await client.health()              # None, or raises EngineDeadError saying why
    client.is_alive, client.dead_reason, client.engine_pid
    await client.tokenize(prompt=... | messages=...), await client.detokenize(ids),
    await client.apply_chat_template(messages), await client.token_bytes()
    client.add_listener(fn)            # fn(RequestRecord) once per sequence, stopped/failed too (engine.metrics)
    client.recent_requests()           # the last RequestRecords (TTFT / TPOT plots)
    await client.shutdown()            # stops the engine process; nothing is left behind

Restarts: ``EngineClient.start(..., restart=RestartPolicy())`` restarts an engine process that dies (same model,
same options) after a back-off, up to ``max_restarts`` times within ``window_s``; meanwhile calls raise
EngineRestartingError (503, retry). ``client.state`` is "ready", "restarting", "dead" or "closed";
``client.add_state_listener(fn)`` calls ``fn(state, detail)`` on every change; ``client.restarts`` counts the
restarts that succeeded. Without a policy a dead engine stays dead (EngineDeadError until reloaded).

Timings: ``RequestDelta.time`` is the engine's time.monotonic() at the end of the step that made it (the same
clock as this process's time.monotonic() on Linux, macOS and Windows); a sequence's final delta carries the
engine's RequestMetrics (queue time, TTFT, e2e, decode time).
"""
