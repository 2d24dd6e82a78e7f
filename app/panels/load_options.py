"""The Load panel's options and memory estimate (app.panels.load.LoadPanel mixes this in): which choices this
machine and model allow (each one it lacks off with the reason), and what the chosen ones will take in memory,
with a verdict and what would make a model fit."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from app import fit
from app.capabilities import TP_REASON
from app.hardware import cpu_has_native_bf16, gpu_compute_capability
from app.panels.load_form import RANGES

ENGINE_DEFAULT_CONTEXT_CAP = 8192
GPU_KERNELS_REASON = "runs on the GPU kernels"
# the strategies that need GPUs: on the CPU the ranks all-reduce through shared memory (host, int8)
GPU_COMM_REASONS = {"nccl": "needs NVIDIA GPUs", "overlap": "needs a GPU's second stream"}
# what a chosen quantization does to the linear layers, for the estimate's note ({dtype}: the load dtype)
# (the engine puts the LM head in int8 under every GPU mode: engine/layers/embedding.py quantize_head)
GPU_QUANT_NOTES = {
    "int8": "The linear layers and the LM head are quantized to int8 while loading (a scale per output channel: "
            "~1 byte a weight); the token embeddings stay {dtype}.",
    "int4": "The linear layers are quantized to 4 bits while loading (groups of 128 with a scale and zero point: "
            "~0.52 bytes a weight), the LM head to int8; the token embeddings stay {dtype}.",
    "fp8": "The linear layers are quantized to fp8 (e4m3) while loading (a scale per output channel: ~1 byte a "
           "weight), the LM head to int8; the token embeddings stay {dtype}.",
}


@functools.lru_cache(maxsize=64)
def _checkpoint_bits(config_path: str) -> int | None:
    try:
        qc = json.loads(Path(config_path).read_text()).get("quantization_config") or {}
        bits = qc.get("bits", qc.get("w_bit"))
        return int(bits) if bits else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def checkpoint_quantization(facts) -> str:
    """A pre-quantized checkpoint's format in words: "GPTQ int4", "AWQ int4", "FP8"."""
    method = (facts.quantization or "").upper()
    bits = _checkpoint_bits(str(Path(facts.path) / "config.json")) if method in ("GPTQ", "AWQ") else None
    return f"{method} int{bits}" if bits else method


def _tokens(n: int) -> str:
    """A context limit rounded down: 45k tokens, 700 tokens."""
    return f"{n // 1024}k tokens" if n >= 1024 else f"{n:,} tokens"


def _an(words: str) -> str:
    """The article before a number said aloud: an 8k, an 11k, an 18,000-token; a 16k, a 128k."""
    lead = words.split("k")[0].split(",")[0].split("-")[0]
    return "an" if lead.startswith("8") or lead in ("11", "18") else "a"


class OptionsMixin:
    """For LoadPanel only: uses its ctx, form, estimate label, entry() and current_key(); sets _fit_problem and
    _last_tp."""

    def _apply_availability(self) -> None:
        if self._applying:
            return
        self._applying = True
        try:
            self._apply_availability_now()
        finally:
            self._applying = False
        self._update_estimate()

    def _apply_availability_now(self) -> None:
        f = self.form
        caps = self.ctx.capabilities
        gpus = self.ctx.num_gpus
        f.set_choice_enabled("device", "cuda", gpus > 0, "no NVIDIA GPU found")
        on_gpu = self._device() == "cuda"
        if not caps.tensor_parallel:
            f.set_field_enabled("tensor_parallel_size", False, TP_REASON)
            f.set_value("tensor_parallel_size", 1)
        else:
            self._apply_tp_sizes(on_gpu)
        tp = f.values().get("tensor_parallel_size") or 1
        if not caps.tensor_parallel:
            f.set_field_enabled("comm_strategy", False, TP_REASON)
        elif tp < 2:
            f.set_field_enabled("comm_strategy", False, "applies with tensor-parallel size 2 or more")
        else:
            f.set_field_enabled("comm_strategy", True)
            for c in f.main.specs["comm_strategy"].choices:
                if c == "auto":
                    continue
                if c not in caps.comm_strategies:
                    f.set_choice_enabled("comm_strategy", c, False, "not in this engine yet")
                elif not on_gpu and c in GPU_COMM_REASONS:  # only what runs on the CPU ranks
                    f.set_choice_enabled("comm_strategy", c, False, GPU_COMM_REASONS[c])
                else:
                    f.set_choice_enabled("comm_strategy", c, True)
        self._apply_quantization_choices(on_gpu)
        self._apply_kv_dtype_choices(on_gpu)
        f.set_field_enabled("gpu_memory_utilization", on_gpu, "applies when the model runs on a GPU")
        f.set_field_enabled("kv_cache_memory_gib", not on_gpu, "applies when the model runs on the CPU")

    def _apply_quantization_choices(self, on_gpu: bool) -> None:
        """CPU: auto, none, int8, gguf (int4 and fp8 are GPU kernels). GPU: auto, none, int8, int4, and fp8 where every
        GPU in use has FP8 tensor cores (compute capability 8.9+; kept on where that is unknown, and the estimate says
        so); gguf blocks are CPU kernels. A value the device does not offer goes back to auto."""
        f = self.form
        f.set_choice_enabled("quantization", "int8", True)
        for q in fit.GPU_ONLY_QUANTIZATIONS:
            f.set_choice_enabled("quantization", q, on_gpu, GPU_KERNELS_REASON)
        if on_gpu:
            f.set_choice_enabled("quantization", "fp8", self._fp8_ok() is not False, fit.FP8_REASON)
        f.set_choice_enabled("quantization", "gguf", not on_gpu, "the GGUF block kernels run on the CPU")
        quant = f.values().get("quantization") or "auto"
        if not f.main.is_choice_enabled("quantization", quant):
            f.set_value("quantization", "auto")
        view = f.main.editors["quantization"].view()
        view.setMinimumWidth(view.sizeHintForColumn(0) + 2 * view.frameWidth() + 8)

    def _apply_kv_dtype_choices(self, on_gpu: bool) -> None:
        """--kv-cache-dtype fp8 (an e4m3 cache: twice the tokens) needs a GPU with FP8 support (compute capability
        8.9+, the engine's check); on the CPU and older GPUs it is off with the reason, and a chosen fp8 goes back
        to auto."""
        f = self.form
        owner = f._owner("kv_cache_dtype")
        if "kv_cache_dtype" not in owner.editors:
            return
        e = self.entry(self.current_key())
        if e is not None and e.facts.shape is not None and e.facts.shape.kv_latent_size:  # the engine refuses it too
            f.set_choice_enabled("kv_cache_dtype", "fp8", False, fit.MLA_FP8_KV_REASON)
        elif not on_gpu:
            f.set_choice_enabled("kv_cache_dtype", "fp8", False, "needs a GPU: the CPU keeps the model dtype")
        else:
            f.set_choice_enabled("kv_cache_dtype", "fp8", self._fp8_ok() is not False, fit.FP8_REASON)
        if not owner.is_choice_enabled("kv_cache_dtype", f.values().get("kv_cache_dtype") or "auto"):
            f.set_value("kv_cache_dtype", "auto")

    def _kv_dtype(self, dtype: str) -> str:
        """The KV cache's element type for the estimate: fp8 (1 byte) when chosen, else the model dtype."""
        return "fp8" if self.form.values().get("kv_cache_dtype") == "fp8" else dtype

    def _gpus_in_use(self) -> list:
        """The GPUs a load would use: the first tensor-parallel-size of them."""
        snap = self.ctx.hardware_snapshot
        if snap is None or not snap.gpus:
            return []
        tp = self.form.values().get("tensor_parallel_size") or 1
        return list(snap.gpus[:max(1, tp)])

    def _apply_tp_sizes(self, on_gpu: bool) -> None:
        """Offer the TP sizes the selected model splits into (engine.config.tp_size_fits: its attention and KV
        heads, and its MLP width): on a GPU up to the number of GPUs; on the CPU, where the ranks are processes
        sharing the cores, up to the form's limit. A size in between that does not fit steps on to the next one
        that does, in the direction the value moved."""
        f = self.form
        editor = f.main.editors["tensor_parallel_size"]
        e = self.entry(self.current_key())
        shape = e.facts.shape if e is not None else None
        form_max = RANGES["tensor_parallel_size"][1]
        limit = min(self.ctx.num_gpus, form_max) if on_gpu else form_max
        # a GGUF MoE's experts kept as blocks on the CPU: only sizes that split them on block boundaries (the engine's
        # rule, engine/expert_blocks.py); quantization "none" dequantizes them and lifts it
        block = fit.expert_block(shape, f.values().get("quantization") or "auto", on_gpu)
        sizes = fit.tp_sizes(limit, shape, block)
        if len(sizes) < 2:
            if on_gpu and limit < 2:
                reason = f"needs two or more GPUs (found {limit})"
            else:
                where = ("2" if limit == 2 else f"2 to {limit}") + (" GPUs" if on_gpu else " processes")
                widths = "".join(f", {name} {width:,}" for name, width in fit.mlp_widths(shape)
                                 if shape.num_experts) if shape is not None else ""
                reason = (f"this model ({shape.num_attention_heads} attention heads, {shape.num_kv_heads} KV heads"
                          f"{widths}) does not split over {where}" if shape is not None else "")
                split = [s for s in fit.tp_sizes(limit, shape) if s > 1]  # sizes only the experts' blocks refuse
                if block is not None and split:
                    reason = f"{reason}: {fit.tp_misfit(split[0], shape, block)}"
            f.set_value("tensor_parallel_size", 1)
            f.set_field_enabled("tensor_parallel_size", False, reason)
            self._last_tp = 1
            return
        # any size up to the limit may be typed: one the model does not split into is replaced by the next that does
        # (in the direction the value moved), and the note beside the field says why and which sizes work
        editor.setMaximum(limit)
        tp = f.values().get("tensor_parallel_size") or 1
        works = ", ".join(map(str, sizes))
        if tp not in sizes:
            up = [s for s in sizes if s > tp]
            down = [s for s in sizes if s < tp]
            new = (up[0] if up else sizes[-1]) if tp > self._last_tp else (down[-1] if down else sizes[0])
            why = fit.tp_misfit(tp, shape, block) or "it does not split this model"
            f.set_field_note("tensor_parallel_size", f"{tp} is not possible: {why}. Using {new}; sizes that work "
                                                     f"here: {works}.")
            f.set_value("tensor_parallel_size", new)
            tp = new
        elif tp != self._last_tp:
            f.set_field_note("tensor_parallel_size", "")
        self._last_tp = tp
        f.set_field_enabled("tensor_parallel_size", True)
        editor.setToolTip(editor.toolTip() + "\nSizes this model splits into"
                          + (" on these GPUs: " if on_gpu else " (CPU ranks share the cores): ") + works)

    def _device(self) -> str:
        device = self.form.values().get("device") or "auto"
        if device == "auto":
            return "cuda" if self.ctx.num_gpus > 0 else "cpu"
        return device

    def _on_options_changed(self) -> None:
        self._apply_availability()

    def _update_estimate(self) -> None:
        self._fit_problem = ""  # set when the estimate says the model does not fit (the Load check refuses then)
        e = self.entry(self.current_key())
        if e is None:
            self.estimate.setText("")
            return
        facts = e.facts
        known, why = fit.can_estimate(facts)
        if not known:  # a garbage file: its size on disk is no estimate, and "it fits" would mislead
            self.estimate.setText(why)
            return
        values = self.form.values()
        device = self._device()
        dtype = values.get("dtype") or "auto"
        if dtype == "auto":
            dtype = ("bfloat16" if cpu_has_native_bf16() else "float32") if device == "cpu" else "bfloat16"
        context = values.get("max_model_len") or min(facts.context_length or ENGINE_DEFAULT_CONTEXT_CAP,
                                                     ENGINE_DEFAULT_CONTEXT_CAP)
        quant = values.get("quantization") or "auto"
        tp = values.get("tensor_parallel_size") or 1
        snap = self.ctx.hardware_snapshot
        on_gpu = device == "cuda" and snap is not None and bool(snap.gpus)
        wb = self._weights(facts, quant, dtype, on_gpu)
        if wb is None:
            self.estimate.setText("Not enough information about this model for an estimate.")
            return
        note = self._quant_note(facts, quant, dtype, on_gpu, wb)
        if on_gpu:
            text = self._gpu_estimate(facts, wb, quant, dtype, context, tp)
        else:
            text = self._cpu_estimate(facts, wb, dtype, context, tp, values)
        text += f"\n{note}" if note else ""
        moe = fit.moe_speed_note(facts.shape, facts.num_params, wb.total)
        text += f"\n{moe}" if moe else ""
        self.estimate.setText(text.replace(" GiB", "\u00a0GiB"))  # a size never wraps from its unit

    def _cpu_estimate(self, facts, wb: fit.WeightBytes, dtype: str, context: int, tp: int, values: dict) -> str:
        """RAM for a CPU load. Each tensor-parallel rank is a process with its own KV-cache pool of the chosen size
        (engine ModelRunner._fixed_kv_blocks, then the executor takes the ranks' minimum) and its own overhead; a
        rank holds only its share of the KV heads, so the pool has room for more tokens."""
        snap = self.ctx.hardware_snapshot
        ram = snap.ram_total if snap is not None else None
        kv_pool = int((values.get("kv_cache_memory_gib") or 2.0) * fit.GIB)  # the engine's CPU default: 2 GiB
        per_token = facts.shape.kv_bytes_per_token(fit.DTYPE_BYTES[dtype], tp) if facts.shape else None
        total = wb.total + tp * (kv_pool + int(fit.CPU_OVERHEAD))
        tokens = kv_pool // per_token if per_token else 0
        room = f"room for about {tokens:,} tokens: {tokens // context:,} sequences of {context:,}" if per_token else ""
        if tp > 1:
            share = ""
            if facts.shape is not None:
                heads = max(1, -(-facts.shape.num_kv_heads // tp))
                share = f"each holds {heads} of the {facts.shape.num_kv_heads} KV heads, so "
            kv = (f"KV cache {tp} x {fit.gib(kv_pool)} (one pool per rank; {share}"
                  f"{room or 'room for more tokens per pool'})")
            where, over = f"CPU, {tp} ranks", f"{tp} x {fit.gib(fit.CPU_OVERHEAD)}"
            weights = f"weights {fit.gib(wb.total)} split over the ranks"
        else:
            kv = f"KV cache {fit.gib(kv_pool)}" + (f" ({room})" if room else "")
            where, over = "CPU", fit.gib(fit.CPU_OVERHEAD)
            weights = f"weights {fit.gib(wb.total)}"
        if ram is not None and total > ram:
            self._fit_problem = (f"it needs about {fit.gib(total)} of RAM and this machine has {fit.gib(ram)} "
                                 "(a smaller KV-cache memory, int8 weights or fewer ranks need less)")
        verdict = "" if ram is None else (" It fits in this machine's memory." if total <= ram else
                                           " That is more than this machine's memory.")
        return (f"About {fit.gib(total)} of RAM ({dtype}, {where}): {weights}, {kv}, overhead {over}"
                f"{'; this machine has ' + fit.gib(ram) if ram else ''}.{verdict}")

    def _weights(self, facts, quant: str, dtype: str, gpu: bool) -> fit.WeightBytes | None:
        return fit.weights_bytes(facts.num_params, dtype, facts.size_bytes,
                                 self.ctx.capabilities.keeps_quantized_weights, quant, facts.shape, gpu=gpu,
                                 prequantized=fit.prequantized_method(facts),
                                 fp8_ok=self._fp8_ok() if gpu else None)

    def _fp8_ok(self) -> bool | None:
        """Whether the GPUs in use have FP8 tensor cores (None: a compute capability is unknown)."""
        return fit.fp8_supported([gpu_compute_capability(g) for g in self._gpus_in_use()])

    def _gpu_estimate(self, facts, wb: fit.WeightBytes, quant: str, dtype: str, context: int, tp: int) -> str:
        """The verdict for the chosen TP size in the user's terms ("Fits on 4 x 24 GiB with a 16k context" /
        "Does not fit: needs ~27.1 GiB per GPU, the GPUs have 24 GiB ...; try int4 or ..."), then the per-GPU
        breakdown."""
        util = self.form.values().get("gpu_memory_utilization") or 0.9
        gpus = self._gpus_in_use()
        mem = min(g.memory_total or 0 for g in gpus)
        cap = int(mem * util)
        est = fit.estimate(wb.total, facts.shape, context, tp, self._kv_dtype(dtype), cap or None, gpu=True)
        n = len(gpus)
        if not mem:  # NVML gave no memory size: the need without a verdict
            return (f"About {est.describe()} at context {context:,} and TP {tp}; the GPU memory could not be read, "
                    "so Kestrel cannot tell whether it fits.")
        box = fit.gib_round(mem)
        ctx_words = fit.context_words(context)
        need = f"~{fit.gib(est.total)}" + (" per GPU" if n > 1 else "")
        if est.fits:
            where = f"one {box} GPU" if n == 1 else f"{n} x {box}"
            head = (f"Fits on {where} with {_an(ctx_words)} {ctx_words} context: {need} of the {fit.gib(cap)} the "
                    f"engine may use ({util:.0%}).")
        else:
            have = "the GPU has" if n == 1 else "the GPUs have"
            tries = self._fit_suggestions(facts, wb, quant, dtype, context, tp, util)
            head = f"Does not fit: needs {need}, {have} {box} ({fit.gib(cap)} at the {util:.0%} share); {tries}."
            self._fit_problem = (f"it needs {need} of GPU memory, {have} {box} ({fit.gib(cap)} at the {util:.0%} "
                                 f"share); {tries}")
        if wb.from_file:
            what = "about the files' size"
        elif quant in GPU_QUANT_NOTES:
            parts = [(f"{quant} linear layers", wb.linear), ("int8 LM head", wb.head),
                     (f"{dtype} embeddings", wb.other)]
            what = ", ".join(f"{words} {fit.gib(-(-n // tp))}" for words, n in parts if n)
        else:
            what = dtype
        per = "Per GPU" if n > 1 else "On the GPU"
        kv_what = " in fp8" if self._kv_dtype(dtype) == "fp8" else ""
        return (f"{head}\n{per}: weights {fit.gib(est.weights)} ({what}), KV cache{kv_what} {fit.gib(est.kv_cache)} "
                f"for one {ctx_words} sequence, overhead {fit.gib(est.overhead)}.")

    def _fit_suggestions(self, facts, wb: fit.WeightBytes, quant: str, dtype: str, context: int, tp: int,
                         util: float) -> str:
        """What would make the model fit, each change alone: a smaller weight format the device offers, a larger
        TP size, a shorter context; else a smaller format with a larger TP size; else more or larger GPUs."""
        snap = self.ctx.hardware_snapshot
        main = self.form.main
        kv_dtype = self._kv_dtype(dtype)

        def capacity(size: int) -> int:
            return int(min(g.memory_total or 0 for g in snap.gpus[:size]) * util)

        def fits(w: fit.WeightBytes, size: int, ctx: int) -> bool:
            return bool(fit.estimate(w.total, facts.shape, ctx, size, kv_dtype, capacity(size), gpu=True).fits)

        formats = []  # (words, weights) smaller than now, least lossy first
        for group in (("int8", "fp8"), ("int4",)):
            names = [q for q in group if q != quant and main.is_choice_enabled("quantization", q)]
            w = self._weights(facts, names[0], dtype, True) if names else None
            if w is not None and w.total < wb.total:
                formats.append((" or ".join(names), w))
        sizes = []
        if main.is_field_enabled("tensor_parallel_size"):
            limit = min(len(snap.gpus), RANGES["tensor_parallel_size"][1])
            sizes = [s for s in fit.tp_sizes(limit, facts.shape) if s > tp]
        tries = []
        fmt = next((words for words, w in formats if fits(w, tp, context)), None)
        if fmt:
            tries.append(fmt)
        size = next((s for s in sizes if fits(wb, s, context)), None)
        if size:
            tries.append(f"tensor-parallel size {size}")
        longest = fit.max_context(capacity(tp), wb.total, facts.shape, tp, kv_dtype) or 0
        if longest >= 256:
            tries.append(f"a context of at most {_tokens(longest)}")
        if tries:
            return "try " + (", ".join(tries[:-1]) + ", or " + tries[-1] if len(tries) > 1 else tries[0])
        for words, w in formats:  # two changes together, the least lossy format first
            size = next((s for s in sizes if fits(w, s, context)), None)
            if size:
                return f"try {words} with tensor-parallel size {size}"
            longest = fit.max_context(capacity(tp), w.total, facts.shape, tp, kv_dtype) or 0
            if longest >= 256:
                return f"try {words} with a context of at most {_tokens(longest)}"
        return "it needs more or larger GPUs (or a smaller model)"

    def _quant_note(self, facts, quant: str, dtype: str, on_gpu: bool, wb: fit.WeightBytes) -> str:
        """What the chosen quantization (or the checkpoint's own) does to the weights in memory."""
        caps = self.ctx.capabilities
        if fit.prequantized_method(facts):
            what = checkpoint_quantization(facts)
            if wb.from_file:  # on a GPU: kept as they are, whatever the mode (only a float LM head is requantized)
                also = ("" if quant in ("none", "auto") else
                        f"; {quant} applies only to layers the checkpoint keeps in float")
                return f"The checkpoint's {what} weights stay quantized on the GPU (about the files' size){also}."
            ratio = wb.total / facts.size_bytes if facts.size_bytes else 0
            times = f": ~{ratio:.1f}x the files' size" if ratio else ""
            where = "on this GPU (no FP8 tensor cores)" if on_gpu else "on the CPU"
            then = "" if quant in ("none", "auto") else f", then quantized to {quant}"
            return f"The checkpoint's {what} weights are dequantized to {dtype} {where}{then}{times}."
        if quant == "int8" and not on_gpu:
            return "Weights are quantized to int8 while loading (about half of bfloat16's bytes per token)."
        if quant in GPU_QUANT_NOTES and on_gpu:
            note = GPU_QUANT_NOTES[quant].format(dtype=dtype)
            if quant == "fp8" and self._fp8_ok() is None:
                note += f" fp8 {fit.FP8_REASON}; this GPU's compute capability could not be read."
            return note
        if quant == "gguf" or (quant == "auto" and wb.from_file and facts.format == "gguf" and not on_gpu):
            return ("The file's Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K weights (linear layers, token "
                    "table, LM head) stay as their blocks (about the file's size); other types are dequantized.")
        if facts.quantization and facts.format == "gguf" and (quant == "none" or on_gpu or (
                quant == "auto" and not caps.keeps_quantized_weights)):
            if on_gpu:
                return (f"The {facts.quantization} weights are dequantized to {dtype} when loaded; int8 or fp8 "
                        "quantization keeps about half of that, int4 about a quarter.")
            return (f"The {facts.quantization} weights are dequantized to {dtype} when loaded; int8 quantization "
                    "keeps about half of that, and a .gguf file's blocks can stay as they are (quantization: GGUF "
                    "blocks kept).")
        return ""
