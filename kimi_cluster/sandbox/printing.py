"""How the sandbox prints a stack's outputs (secrets masked, long values cut to a line) and the verification's
report (one row per check)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Where the whole of a value cut short here is: the stack's own outputs, as the CLI gives them.
WHOLE_VALUE = "whole value: pulumi stack output --show-secrets"


def format_outputs(outputs: Mapping[str, Any], secret_names: frozenset[str] | set[str]) -> str:
    width = max((len(k) for k in outputs), default=0)
    lines = []
    for key in sorted(outputs):
        value = outputs[key]
        if key in secret_names:
            text = "[secret]"
        elif isinstance(value, (dict, list)):
            text = json.dumps(value)
            if len(text) > 160:
                text = (f"{{{', '.join(value)}}}" if isinstance(value, dict) else f"[{len(value)} items]") + \
                    f" ({WHOLE_VALUE})"
        elif isinstance(value, str) and "\n" in value.strip():
            # A PEM certificate: its first line says what it is; the whole value is one stack output away.
            text = f"{value.strip().splitlines()[0]} ... ({len(value.strip().splitlines())} lines; {WHOLE_VALUE})"
        else:
            text = str(value)
        lines.append(f"  {key:<{width}}  {text}")
    return "\n".join(lines)


def format_report(report: list[Mapping[str, Any]]) -> str:
    lines = [f"  {'check':<19} {'result':<6} {'latency':>8}  detail", f"  {'-' * 19} {'-' * 6} {'-' * 8}  {'-' * 40}"]
    for row in report:
        status = "PASS" if row.get("passed") else ("FAIL" if row.get("required", True) else "fail")
        lines.append(f"  {row.get('name', '?'):<19} {status:<6} {float(row.get('latency_s') or 0):7.2f}s  "
                     f"{row.get('detail', '')}")
    return "\n".join(lines)
