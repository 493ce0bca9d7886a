"""Renders the node bring-up scripts from kimi_cluster/plan/templates/*.sh.j2 through one strict jinja2 environment.

StrictUndefined turns a missing value into an error at render time, so a typo never ships an empty flag to a node;
every value reaches the shell through the `q` filter, so nothing a user configures is ever parsed as shell code.
The rule is enforced, not hoped for: the environment's `finalize` refuses any `{{ value }}` that is neither quoted
(`| q`, `| words`), nor a number, nor a plain word that no shell parses as code, nor program-owned `Verbatim` text.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, Undefined

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

# Literal characters that need no quoting inside double quotes, around ${NAME} references.
_SAFE_LITERAL = r"[A-Za-z0-9_=:./,@%+\-<>]*"
_SHELL_EXPR = re.compile(rf"^{_SAFE_LITERAL}(\$\{{[A-Za-z_][A-Za-z0-9_]*\}}{_SAFE_LITERAL})*$")


class Quoted(str):
    """Text already quoted for the shell by `shell_quote` or `shell_words`."""


class Verbatim(str):
    """Program-owned text placed as it is: a comment, or the body of a quoted heredoc. Never a user's value."""


# What may appear unquoted: no quote, `$`, backquote, backslash, glob, brace, redirection or command separator.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_.,:/@%+= -]*")


def _finalize(value: Any) -> Any:
    """Every `{{ ... }}` passes here: an unquoted value that a shell could parse as code fails the render."""
    if isinstance(value, (Quoted, Verbatim, bool, int, float, Undefined)):
        return value  # an Undefined raises (StrictUndefined) when the template engine prints it
    if isinstance(value, str) and _PLAIN_WORD.fullmatch(value):
        return value
    raise ValueError(f"template value {value!r} would reach the shell unquoted; pass it through `| q`")


class ShellExpr(str):
    """A word the node's shell must expand (a `${NAME}` only known at run time, such as the private interface).

    Only `${NAME}` references and plain characters are allowed, so double-quoting it is always safe.
    """

    def __new__(cls, value: str) -> ShellExpr:
        if not _SHELL_EXPR.match(value):
            raise ValueError(f"{value!r} is not a plain word with ${{NAME}} references")
        return super().__new__(cls, value)


def shell_quote(value: Any) -> str:
    """One shell word: run-time expressions double-quoted, everything else single-quoted literally."""
    if isinstance(value, ShellExpr):
        return Quoted(f'"{value}"')
    if isinstance(value, bool):
        value = "true" if value else "false"
    return Quoted(shlex.quote(str(value)))


def shell_words(argv: Iterable[Any], continuation: str = "") -> str:
    """An argv as shell words. Items that are tuples (a flag and its value) stay together on one line when a
    continuation such as ' \\\n  ' is given, which keeps long commands readable in the plan and on the node."""
    parts = []
    for item in argv:
        if isinstance(item, (tuple, list)):
            parts.append(" ".join(shell_quote(w) for w in item))
        else:
            parts.append(shell_quote(item))
    return Quoted((continuation or " ").join(parts))


def _environment(finalize: Any = None) -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=finalize,
    )
    env.filters["q"] = shell_quote
    env.filters["words"] = shell_words
    return env


# Shell scripts (*.sh.j2) under the quoting rule; other templates (a Caddyfile) have their own syntax and their
# values are checked where they are made.
_ENV = _environment(_finalize)
_TEXT_ENV = _environment()


def render(template: str, **values: Any) -> str:
    """Render kimi_cluster/plan/templates/<template> (e.g. "storage.sh.j2") with `values`; a missing value raises."""
    env = _ENV if template.endswith(".sh.j2") else _TEXT_ENV
    return env.get_template(template).render(**values)
