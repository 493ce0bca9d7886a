"""The models check: /v1/models lists exactly the served model id the cluster promised."""

from __future__ import annotations

import json
from typing import Any

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.text import short


def check_models(api: Api) -> tuple[str, dict[str, Any]]:
    data = api.json_ok("GET", "/v1/models")
    entries = data.get("data")
    if not isinstance(entries, list):
        raise CheckFailed(f"/v1/models has no data list: {short(json.dumps(data))}")
    ids = [e.get("id") for e in entries if isinstance(e, dict)]
    expected = api.target.model
    metrics: dict[str, Any] = {"served_ids": ids}
    if expected not in ids:
        raise CheckFailed(
            f"/v1/models lists {ids}, not {expected!r}; "
            f"the server was started with another --served-model-name",
            metrics,
        )
    if len(ids) != 1:
        raise CheckFailed(f"/v1/models lists {len(ids)} models {ids}; expected exactly {expected!r}", metrics)
    entry = entries[ids.index(expected)]
    metrics["max_model_len"] = entry.get("max_model_len")
    metrics["owned_by"] = entry.get("owned_by")
    return (
        f"serves {expected} (owned_by {metrics['owned_by']}, max_model_len {metrics['max_model_len']})",
        metrics,
    )
