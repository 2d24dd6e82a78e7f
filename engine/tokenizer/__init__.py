"""Tokenizers, chat templates and the incremental detokenizer.

``Tokenizer`` (``hf``) wraps a ``tokenizers.Tokenizer`` built from a Hugging Face directory or a GGUF file
(``gguf_vocab``) and behaves like transformers' tokenizer for the same files; ``render_chat_template``
(``chat_template``) renders chat templates as transformers does; ``IncrementalDetokenizer``
(``detokenizer``) turns a token stream into text deltas that never split a UTF-8 character.
"""

from engine.tokenizer.chat_template import render_chat_template
from engine.tokenizer.detokenizer import IncrementalDetokenizer
from engine.tokenizer.gguf_vocab import bytes_to_unicode
from engine.tokenizer.hf import Tokenizer

__all__ = ["IncrementalDetokenizer", "Tokenizer", "bytes_to_unicode", "render_chat_template"]
