"""The checks, one module per check or small group, and their registry in canonical order.

Each check takes an Api and returns (detail, metrics) or raises CheckFailed; the runner times and
wraps it. A new check is one module plus one line in CHECKS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.endpoint_checks.anthropic import check_anthropic
from kimi_cluster.checks.endpoint_checks.auth import check_auth
from kimi_cluster.checks.endpoint_checks.chat import check_chat, check_effort, check_preserved_thinking
from kimi_cluster.checks.endpoint_checks.clients import check_clients
from kimi_cluster.checks.endpoint_checks.image import check_image
from kimi_cluster.checks.endpoint_checks.models import check_models
from kimi_cluster.checks.endpoint_checks.stream import check_stream
from kimi_cluster.checks.endpoint_checks.tls_handshake import check_tls
from kimi_cluster.checks.endpoint_checks.tool_calls import check_tool_calls

CheckBody = Callable[[Api], tuple[str, dict[str, Any]]]

CHECKS: dict[str, CheckBody] = {
    "tls": check_tls,
    "models": check_models,
    "auth": check_auth,
    "chat": check_chat,
    "effort": check_effort,
    "preserved_thinking": check_preserved_thinking,
    "tool_calls": check_tool_calls,
    "image": check_image,
    "anthropic": check_anthropic,
    "stream": check_stream,
    "clients": check_clients,
}

CHECK_NAMES: tuple[str, ...] = tuple(CHECKS)
