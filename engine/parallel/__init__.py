"""Tensor parallelism's plumbing, below the runner and the layers that use it:

- context.py    TPContext: rank, size, the communicator; what the sharded layers (engine/layers) use
- comm/         the communication strategies (nccl, host, int8, auto), their counters, the group's shared
                segment (comm/shm.py) and their configuration (comm/config.py: CommConfig, torch-free)
The dual-stream micro-batch overlap (comm_strategy=overlap) drives the model's own decoder layers:
engine/models/overlap.py. The driving side - rank 0's TPExecutor, the worker processes, the per-step mailbox - is
engine/executor, above the runner; nothing here imports it or engine.runner.

The native side (host all-reduce, SIMD reductions, int8 kernels, CUDA kernels) is csrc/comm.
"""
