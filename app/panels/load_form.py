"""The Load panel's engine options form: EngineConfig's fields as a main and an advanced half (app.widgets.
config_form), with their labels, ranges, choices and units."""

from __future__ import annotations

from engine.config import EngineConfig

MAIN_FIELDS = ["quantization", "dtype", "device", "max_model_len", "gpu_memory_utilization", "kv_cache_memory_gib",
               "enable_prefix_caching", "tensor_parallel_size", "comm_strategy"]
LABELS = {
    "quantization": "Quantization", "dtype": "Data type", "device": "Device", "max_model_len": "Context length",
    "gpu_memory_utilization": "KV-cache memory share (GPU)", "kv_cache_memory_gib": "KV-cache memory (CPU)",
    "enable_prefix_caching": "Prefix caching", "tensor_parallel_size": "Tensor-parallel size",
    "comm_strategy": "Communication strategy", "block_size": "KV block size", "num_kv_blocks": "KV blocks",
    "max_num_seqs": "Max concurrent requests", "max_num_batched_tokens": "Token budget per step",
    "num_threads": "CPU threads", "seed": "Seed", "enforce_eager": "No decode graphs or tapes",
    "async_scheduling": "Async scheduling", "speculative_config": "Speculative decoding",
}
CHOICE_LABELS = {
    "comm_strategy": {"auto": "Auto (measured at start-up)", "nccl": "NCCL", "int8": "Int8-quantized all-reduce",
                      "host": "Host (shared memory + SIMD)", "overlap": "Dual-stream overlap"},
    "quantization": {"auto": "Auto (a .gguf file's blocks kept on the CPU; otherwise the checkpoint's own weights)",
                     "none": "None (the checkpoint's own weights; a .gguf file dequantized to the chosen dtype)",
                     "int8": "int8 (CPU or GPU: 8-bit weights; ~2x smaller than bf16)",
                     "int4": "int4 (GPU: 4-bit weights, groups of 128; ~3.8x smaller than bf16)",
                     "fp8": "fp8 (GPU: 8-bit float weights; ~2x smaller than bf16)",
                     "gguf": "GGUF blocks kept (CPU: Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K)"},
    "async_scheduling": {"auto": "Auto (on a GPU)", "on": "On", "off": "Off"},
    "dtype": {"auto": "Auto"}, "device": {"auto": "Auto", "cpu": "CPU", "cuda": "NVIDIA GPU (CUDA)"},
}
RANGES = {"max_model_len": (0, 1 << 20), "gpu_memory_utilization": (0.05, 0.99), "kv_cache_memory_gib": (0, 4096),
          "tensor_parallel_size": (1, 8), "block_size": (0, 1024), "num_kv_blocks": (0, 1 << 24),
          "max_num_seqs": (1, 65536), "max_num_batched_tokens": (16, 1 << 20), "num_threads": (0, 1024),
          "seed": (0, 2**31 - 1)}
NONE_TEXT = {"max_model_len": "model's (≤ 8192)", "kv_cache_memory_gib": "auto (2 GiB)", "num_kv_blocks": "auto",
             "num_threads": "physical cores", "block_size": "auto (GPU 64, CPU 16)",
             "speculative_config": 'off; {"method": "ngram", "num_speculative_tokens": 4} guesses the next tokens '
                                   'from the text so far: faster copies and edits, the same output'}
SUFFIXES = {"kv_cache_memory_gib": " GiB", "max_model_len": " tokens"}


class ConfigFormPair:
    """The main and the advanced halves of the EngineConfig form, acting as one."""

    def __init__(self, main: list[str], advanced: list[str]):
        from app.widgets.config_form import ConfigForm

        kw = {"labels": LABELS, "ranges": RANGES, "none_text": NONE_TEXT, "choice_labels": CHOICE_LABELS,
              "suffixes": SUFFIXES}
        self.main = ConfigForm(EngineConfig, main, **kw)
        self.advanced = ConfigForm(EngineConfig, advanced, **kw)
        self.changed = _MergedSignal(self.main.changed, self.advanced.changed)

    def _owner(self, name: str):
        return self.main if name in self.main.editors else self.advanced

    def values(self) -> dict:
        return {**self.main.values(), **self.advanced.values()}

    def set_values(self, values: dict) -> None:
        self.main.set_values(values)
        self.advanced.set_values(values)

    def set_value(self, name: str, value) -> None:
        owner = self._owner(name)
        if owner.values().get(name) != value:
            owner.set_value(name, value)

    def set_field_enabled(self, name: str, enabled: bool, reason: str = "") -> None:
        self._owner(name).set_field_enabled(name, enabled, reason)

    def set_choice_enabled(self, name: str, choice: str, enabled: bool, reason: str = "") -> None:
        self._owner(name).set_choice_enabled(name, choice, enabled, reason)

    def set_field_note(self, name: str, note: str) -> None:
        self._owner(name).set_field_note(name, note)


class _MergedSignal:
    def __init__(self, *signals):
        self.signals = signals

    def connect(self, slot) -> None:
        for s in self.signals:
            s.connect(slot)
