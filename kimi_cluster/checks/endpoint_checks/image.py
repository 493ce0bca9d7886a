"""The image check: the model names the two colours of a left-red, right-blue PNG."""

from __future__ import annotations

import base64
import re
from typing import Any

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.png import make_split_png
from kimi_cluster.checks.prompts import IMAGE_PROMPT
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.text import short


def check_image(api: Api) -> tuple[str, dict[str, Any]]:
    b64 = base64.b64encode(make_split_png()).decode()
    answer = api.chat(
        [{
            "role": "user",
            "content": [
                {"type": "text", "text": IMAGE_PROMPT},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
            ],
        }],
        effort="low",
    ).content
    metrics = {"answer": short(answer, 200)}
    missing = [c for c in ("red", "blue") if not re.search(rf"\b{c}\b", answer, re.IGNORECASE)]
    if missing:
        raise CheckFailed(
            f"the answer {short(answer, 160)!r} does not name {' and '.join(missing)} "
            "for a left-red, right-blue image",
            metrics,
        )
    return f"named red and blue: {short(answer, 80)!r}", metrics
