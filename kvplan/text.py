"""The one sanitiser for text that a file or a flag puts on a terminal, in HTML or in a plot label.

Names and values come from files and flags (a model folder, a workload's `name:`, a GPU, a price
row, a reason quoting any of them). They may hold terminal escape sequences (clear the screen, set
the window title), rich markup (`[/]` raises rich's MarkupError), HTML, a `javascript:` link or
matplotlib mathtext (`$\\foo{$` raises in the renderer), or a spreadsheet formula (`=HYPERLINK(...)` in a
CSV cell runs when the file is opened). Every view passes such text through one
of these functions, so that it is shown literally and can neither drive the terminal, add a link
nor break a renderer. Error lines use the same rule (`cut`).

No heavy imports: `kvplan size` imports this module (rich is imported where it is needed).
"""

from __future__ import annotations

import html
from urllib.parse import urlsplit

MAX_MESSAGE = 400  # characters of one error line; a 10 MB value in a file must not become one
LINK_SCHEMES = ("http", "https")  # a report links only to the web: no javascript:, data:, file:


def printable(text) -> str:
    """`text` with every character a terminal would not print shown as its Python escape: C0 and
    C1 controls (so ESC, and with it every ANSI CSI/OSC sequence, becomes the harmless `\\x1b`),
    DEL, newlines, bidi overrides and zero-width marks (Unicode's "Other" and "Separator" classes
    but the space)."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def cut(text: str, limit: int = MAX_MESSAGE) -> str:
    """`printable(text)`, or its head and tail around a note of how much was left out."""
    if len(text) > limit:
        head, tail = limit * 3 // 4, limit // 8
        text = f"{text[:head]}...[{len(text) - head - tail:,} characters cut]...{text[-tail:]}"
    shown = printable(text)
    return shown if shown == text else cut(shown, limit)


def terminal(text) -> str:
    """For a rich table cell, title or a line printed with markup: printable, with rich markup
    escaped (a name `[red]x` or `x[/]y` prints as it is written)."""
    from rich.markup import escape

    return escape(printable(text))


def html_text(text) -> str:
    """For HTML text or an attribute value: printable (as on the terminal), then HTML-escaped."""
    return html.escape(printable(text), quote=True)


def html_link(url, label: str = "source") -> str:
    """`<a href=URL>label</a>` for an absolute http(s) URL; anything else (a `javascript:` or
    `data:` URL, a relative path, a value with spaces or controls that a browser would trim
    before reading its scheme) is shown as escaped text, never as a link."""
    text = html_text("" if url is None else url)
    if not isinstance(url, str) or printable(url) != url or any(c.isspace() for c in url):
        return text
    try:
        parts = urlsplit(url)
    except ValueError:  # a malformed IPv6 host
        return text
    if parts.scheme.lower() not in LINK_SCHEMES or not parts.netloc:
        return text
    return f'<a href="{text}" rel="noreferrer">{html_text(label)}</a>'


def plot_label(text) -> str:
    """For a matplotlib title, axis label or legend entry: printable, with `$` escaped so that no
    part of a name is read as mathtext (a backslash outside `$...$` is drawn as it is)."""
    return printable(text).replace("$", r"\$")


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula


def csv_cell(value):
    """For a CSV cell: numbers as they are; text that a spreadsheet would run as a formula (it
    starts with = + - @, a tab or a carriage return) prefixed with an apostrophe, which Excel,
    LibreOffice and Google Sheets show as text (OWASP's advice for CSV injection)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 configuration", "2 configurations", "1,024 replicas" (`plural` for irregular nouns)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
