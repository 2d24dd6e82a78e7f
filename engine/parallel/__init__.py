"""Tensor parallelism: one process per rank (GPU, or a share of the CPU cores), rank 0 inside the EngineCore.

- context.py    TPContext: rank, size, the communicator; what the sharded layers (engine/layers) use
- executor.py   rank 0's side: starts the workers, agrees on the KV cache, ships each step, watches them
- worker.py     a worker process (python -m engine.parallel.worker)
- mailbox.py    the per-step channel (pickled StepInputs through the shared segment)
- comm/         the communication strategies (nccl, host, int8, auto) and their counters
The dual-stream micro-batch overlap (comm_strategy=overlap) drives the model's own decoder layers:
engine/models/overlap.py.

The native side (host all-reduce, SIMD reductions, int8 kernels, CUDA kernels) is csrc/comm.
"""
