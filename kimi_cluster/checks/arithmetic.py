"""Arithmetic for the model's `calculate` tool calls, evaluated by walking the AST, never eval()."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def safe_arithmetic(expression: str) -> float | int:
    """Evaluate + - * / // % ** over numbers; anything else is refused.

    The expression comes from the model, so it must never reach eval().
    """
    if not isinstance(expression, str) or len(expression) > 200:
        raise ValueError("expression must be a string of at most 200 characters")

    def walk(node: ast.AST) -> float | int:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = walk(node.left), walk(node.right)
            # a model-chosen exponent like 9**9**9 would hang the verifier
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported element {type(node).__name__} in {expression!r}")

    return walk(ast.parse(expression.replace("×", "*").replace("^", "**"), mode="eval").body)
