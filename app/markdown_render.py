"""Markdown -> the HTML subset Qt's rich-text engine renders: fenced code in a shaded monospace block,
tables, lists. Raw HTML in the model's output is shown as text, never interpreted. A reply still streaming
may hold an unclosed code fence: it is closed for rendering so the code shows as code while it grows."""

from __future__ import annotations

import html
import re

CODE_BG = "#f3f4f6"
CODE_BORDER = "#e5e7eb"
_FENCE = re.compile(r"^\s{0,3}(?:```(?!.*`)|~~~)", re.MULTILINE)  # a ``` line with more backticks is inline code
_PRE = re.compile(r"<pre><code(?: class=\"language-([\w+#.-]+)\")?>(.*?)</code></pre>", re.DOTALL)
_md = None


def _converter():
    global _md
    if _md is None:
        import markdown

        md = markdown.Markdown(extensions=["fenced_code", "tables", "sane_lists"])
        # raw HTML stays text: drop the block and inline HTML handlers
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")
        _md = md
    return _md


def close_open_fence(text: str) -> str:
    if len(_FENCE.findall(text)) % 2:
        return text + ("\n" if not text.endswith("\n") else "") + "```"
    return text


def to_html(text: str) -> str:
    md = _converter()
    md.reset()
    body = md.convert(close_open_fence(text))
    body = _PRE.sub(_code_block, body)
    body = body.replace("<table>", '<table border="1" cellspacing="0" cellpadding="4" '
                        'style="border-color:#d1d5db; border-collapse: collapse;">')
    body = body.replace("<code>", f'<code style="font-family: monospace; background-color: {CODE_BG};">')
    return body


def _code_block(m: re.Match) -> str:
    lang = m.group(1)
    code = m.group(2).rstrip("\n")
    label = (f'<div style="color:#6b7280; font-size:small; margin-bottom:4px;">{html.escape(lang)}</div>'
             if lang else "")
    return (f'<table width="100%" cellspacing="0" cellpadding="8" style="margin-top:6px; margin-bottom:6px; '
            f'border: 1px solid {CODE_BORDER};" bgcolor="{CODE_BG}"><tr><td>{label}'
            f'<pre style="font-family: monospace; white-space: pre-wrap; margin:0;">{code}</pre>'
            "</td></tr></table>")
