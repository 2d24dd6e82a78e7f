"""engine/kernel_config.py: the typed kernel configuration, its round trip and its per-device resolution."""

import json
import subprocess
import sys

import pytest

from engine.kernel_config import DeviceFacts, KernelConfig, resolve


def test_round_trip_through_json():
    kc = KernelConfig(prefill_attention="triton", cpu_isa="avx2", int_mma_warps=4, pdl=True)
    assert KernelConfig.from_dict(json.loads(json.dumps(kc.to_dict()))) == kc


def test_bad_values_and_unknown_fields_raise():
    with pytest.raises(ValueError, match="prefill_attention"):
        KernelConfig(prefill_attention="flash")
    with pytest.raises(ValueError, match="int_mma_warps"):
        KernelConfig(int_mma_warps=17)
    with pytest.raises(ValueError, match="unknown"):
        KernelConfig.from_dict({"cuda_decode_u": 4})


def test_resolve_per_device():
    h100 = resolve(DeviceFacts("cuda", (9, 0), triton=True))
    assert (h100.prefill_attention, h100.pdl) == ("auto", True)
    ada = resolve(DeviceFacts("cuda", (8, 9), triton=True))
    assert ada.pdl is False
    assert resolve(DeviceFacts("cuda", (9, 0), triton=False)).prefill_attention == "sdpa"
    cpu = resolve(DeviceFacts(cpu_flags=frozenset({"avx512f", "amx_bf16"})))
    assert (cpu.prefill_attention, cpu.cpu_amx, cpu.gemm_threads, cpu.pdl) == ("sdpa", "on", "pool", False)
    assert resolve(DeviceFacts(omp_passive=False)).gemm_threads == "openmp"
    assert resolve(DeviceFacts(cpu_flags=frozenset({"avx2"}))).cpu_amx == "off"
    # a choice made is kept; resolving twice changes nothing
    forced = resolve(DeviceFacts(cpu_flags=frozenset({"amx_bf16"})), base=KernelConfig(cpu_amx="off"))
    assert forced.cpu_amx == "off" and resolve(DeviceFacts(cpu_flags=frozenset({"amx_bf16"})), base=forced) == forced


def test_engine_config_fields_of_the_same_name_override():
    class Cfg:
        prefill_attention = "triton"
        cpu_isa = None

    kc = resolve(DeviceFacts(), Cfg(), base=KernelConfig(cpu_isa="scalar"))
    assert (kc.prefill_attention, kc.cpu_isa) == ("triton", "scalar")


def test_torch_free():
    code = "import sys, engine.kernel_config; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
