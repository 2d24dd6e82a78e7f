"""Communication strategies of tensor parallelism (see base.py for the interface):

- ``nccl``  (dist.py)  torch.distributed: NCCL on GPUs, gloo on the CPU
- ``host``  (host.py)  POSIX shared memory + SIMD reduction in csrc/comm (zero-copy mapped kernel / copy
                        pipeline on GPUs)
- ``int8``  (int8.py)  group-wise absmax int8 reduce-scatter + all-gather
- ``auto``  (auto.py)  start-up micro-benchmark picks per message size
- ``overlap`` (group.py, engine/models/overlap.py) two micro-batches, one's all-reduce on a second stream

Their tuning is one typed value, ``config.CommConfig`` (torch-free), resolved once when the engine starts and
handed to every rank. This package's __init__ imports nothing, so the configuration imports without torch.
"""
