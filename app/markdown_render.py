"""Markdown -> the HTML subset Qt's rich-text engine renders: tables, lists, inline code, and fenced code blocks
with syntax highlighting (Pygments, inline styles; plain monospace when Pygments is missing or the language is
unknown). Raw HTML in the model's output is shown as text, never interpreted. A reply still streaming may hold
an unclosed code fence: it is closed for rendering so the code shows as code while it grows.

``segments`` cuts a reply into prose and code blocks (the message view gives each code block its own frame with
a Copy button); ``to_html`` is the whole reply as one HTML string. Colours come from the theme in use
(app.theme.current()) unless one is given."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from functools import lru_cache

from app import theme as themes

_FENCE = re.compile(r"^\s{0,3}(?:```(?!.*`)|~~~)", re.MULTILINE)  # a ``` line with more backticks is inline code
_PRE = re.compile(r"<pre><code(?: class=\"language-([\w+#.-]+)\")?>(.*?)</code></pre>", re.DOTALL)
_md = None
MAX_HIGHLIGHT_CHARS = 200_000  # a bigger block is shown plain (highlighting it on every streamed render would lag)


@dataclass(frozen=True)
class Segment:
    kind: str  # "html": prose; "code": a code block
    html: str  # the prose, or the code's highlighted lines (no frame)
    code: str = ""  # a code block's raw text (what Copy puts on the clipboard)
    language: str = ""


def _converter():
    global _md
    if _md is None:
        # ~0.16 s: loaded with the first reply rendered, not at start-up
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


def _convert(text: str) -> str:
    md = _converter()
    md.reset()
    return md.convert(close_open_fence(text))


def _prose(body: str, theme: themes.Theme) -> str:
    body = body.replace("<table>", '<table border="1" cellspacing="0" cellpadding="4" '
                        f'style="border-color:{theme["border_strong"]}; border-collapse: collapse;">')
    return body.replace("<code>", f'<code style="font-family: monospace; '
                        f'background-color: {theme["inline_code_bg"]};">')


def segments(text: str, theme: themes.Theme | None = None) -> list[Segment]:
    """``text`` as prose and code blocks, in order (empty prose between blocks left out)."""
    theme = theme or themes.current()
    body = _convert(text)
    out: list[Segment] = []
    pos = 0
    for m in _PRE.finditer(body):
        prose = body[pos:m.start()]
        if prose.strip():
            out.append(Segment("html", _prose(prose, theme)))
        lang = m.group(1) or ""
        code = html.unescape(m.group(2)).rstrip("\n")
        out.append(Segment("code", highlight(code, lang, theme.pygments_style), code, lang))
        pos = m.end()
    prose = body[pos:]
    if prose.strip() or not out:
        out.append(Segment("html", _prose(prose, theme)))
    return out


def to_html(text: str, theme: themes.Theme | None = None) -> str:
    """The whole reply as one HTML string (each code block a shaded, highlighted box)."""
    theme = theme or themes.current()
    parts = []
    for s in segments(text, theme):
        if s.kind == "html":
            parts.append(s.html)
        else:
            label = (f'<div style="color:{theme["muted"]}; font-size:small; margin-bottom:4px;">'
                     f'{html.escape(s.language)}</div>' if s.language else "")
            parts.append(f'<table width="100%" cellspacing="0" cellpadding="8" style="margin-top:6px; '
                         f'margin-bottom:6px; border: 1px solid {theme["code_border"]};" '
                         f'bgcolor="{theme["code_bg"]}"><tr><td>{label}{s.html}</td></tr></table>')
    return "".join(parts)


@lru_cache(maxsize=256)
def highlight(code: str, language: str, style: str = "default") -> str:
    """``code`` as a ``<pre>`` of coloured spans (inline styles: Qt's rich text has no style sheets for them).
    A finished block is cached; the block still streaming is highlighted again as it grows (a partial block is
    just shorter code: lexers never fail on it)."""
    fmt = _formatter(style)
    lexer = _lexer(language) if fmt is not None and len(code) <= MAX_HIGHLIGHT_CHARS else None
    if lexer is None:
        inner = html.escape(code)
        color = ""
    else:
        # the gui extra's; loaded with the first code block
        import pygments

        inner = pygments.highlight(code, lexer, fmt).rstrip("\n")
        default = _default_color(fmt.style)
        color = f" color: {default};" if default else ""
    return (f'<pre style="font-family: monospace; white-space: pre-wrap; margin: 0;{color}">'
            f"{inner}</pre>")


@lru_cache(maxsize=64)
def _lexer(language: str):
    """The Pygments lexer for a fence's language tag (None: no Pygments, or no such language)."""
    if not language:
        return None
    try:
        from pygments.lexers import get_lexer_by_name
        from pygments.util import ClassNotFound
    except ImportError:
        return None
    try:
        return get_lexer_by_name(language.lower(), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


@lru_cache(maxsize=8)
def _formatter(style: str):
    try:
        from pygments.formatters import HtmlFormatter
        from pygments.util import ClassNotFound
    except ImportError:
        return None
    try:
        return HtmlFormatter(style=style, noclasses=True, nowrap=True)
    except ClassNotFound:
        return HtmlFormatter(style="default", noclasses=True, nowrap=True)


def _token_text():
    from pygments.token import Text

    return Text


def _default_color(style) -> str:
    """The style's colour of plain text ("" when it leaves it to the page)."""
    text = style.styles.get(_token_text(), "")
    m = re.search(r"#[0-9a-fA-F]{3,6}", text or "")
    return m.group(0) if m else ""
