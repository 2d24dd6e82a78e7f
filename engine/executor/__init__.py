"""Tensor parallelism's driving side, above the runner: one process per rank (GPU, or a share of the CPU cores),
rank 0 inside the EngineCore.

- tp_executor.py  rank 0's side: resolves the communication configuration once, starts the workers, agrees on
                  the KV cache, ships each step, watches them
- worker.py       a worker process (python -m engine.executor.worker): its boot data carries every configuration
- mailbox.py      the per-step channel (pickled StepInputs through the group's shared segment)

What the runner and the layers use - TPContext, the communicator and its strategies, CommConfig, the shared
segment - sits below the runner, in engine/parallel; nothing there imports this package or engine.runner.
"""
