"""Communication strategies of tensor parallelism (see base.py for the interface):

- ``nccl``  (dist.py)  torch.distributed: NCCL on GPUs, gloo on the CPU
- ``host``  (host.py)  POSIX shared memory + SIMD reduction in csrc/comm (zero-copy mapped kernel / copy
                        pipeline on GPUs)
- ``int8``  (int8.py)  group-wise absmax int8 reduce-scatter + all-gather
- ``auto``  (auto.py)  start-up micro-benchmark picks per message size
- ``overlap`` (group.py, ../overlap.py) two micro-batches, one's all-reduce on a second stream
"""

from engine.parallel.comm.base import CommStats, CommStrategy, CommTotals, pcie_mode, peer_access_allowed
from engine.parallel.comm.group import STRATEGIES, Communicator

__all__ = [
           "STRATEGIES",
           "CommStats",
           "CommStrategy",
           "CommTotals",
           "Communicator",
           "pcie_mode",
           "peer_access_allowed",
]
