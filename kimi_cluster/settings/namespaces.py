"""Which config namespaces a stack may use, and the hyperstack: keys the providers read.

Pulumi hands every key of the stack's config to the program, and a key the program never asks for does nothing: a
misspelt namespace (`kimі-cluster:` with a Cyrillic і, `kimi_cluster:`, a leading space) would drop every key under
it in silence, and the defaults would deploy. So a key outside the namespaces below is refused, naming the nearest.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from kimi_cluster.hyperstack_api.api import API_KEY_CONFIG, API_URL_CONFIG, RETRY_BASE_CONFIG, retry_base_problem
from kimi_cluster.settings.errors import close_match, shown
from kimi_cluster.settings.keys import NAMESPACE

# Ours; the providers' (components/hyperstack); Pulumi's own (pulumi:tags, pulumi:template,
# pulumi:disable-default-providers); pulumi-command's, the one provider package the program uses (it reads none
# today, but a provider namespace is Pulumi's to give).
KNOWN_NAMESPACES = (NAMESPACE, "hyperstack", "pulumi", "command")
HYPERSTACK_KEYS = (API_URL_CONFIG, API_KEY_CONFIG, RETRY_BASE_CONFIG)


def _nearest_namespace(namespace: str) -> str | None:
    """The known namespace `namespace` was meant to be: case, spaces, invisible and look-alike letters aside."""
    folded = "".join(c for c in namespace.lower() if c.isascii() and c.isprintable() and not c.isspace())
    folded = folded.replace("_", "-")
    close = difflib.get_close_matches(folded, KNOWN_NAMESPACES, n=1, cutoff=0.6)
    return close[0] if close else None


def foreign_key_problems(config: Mapping[str, Any] | Iterable[str]) -> list[str]:
    """Every key of a stack's config (full keys, "namespace:key") this project cannot have meant, and a bad
    hyperstack:retryBaseSeconds; one line each, naming the key and the nearest known one."""
    values = config if isinstance(config, Mapping) else dict.fromkeys(config)
    problems = []
    for key in values:
        text = str(key)
        namespace, colon, name = text.partition(":")
        if not colon:
            problems.append(f"{shown(text)} has no namespace, so nothing reads it; did you mean "
                            f"{NAMESPACE}:{text.strip()}? (pulumi config set {NAMESPACE}:{text.strip()} VALUE)")
            continue
        if namespace not in KNOWN_NAMESPACES:
            near = _nearest_namespace(namespace)
            hint = f"did you mean {near}:{name.strip()}?" if near else "no namespace of this project is close"
            problems.append(f"{shown(text)} is outside the namespaces this stack reads "
                            f"({', '.join(KNOWN_NAMESPACES)}), so it would be dropped in silence; {hint} "
                            f"Remove it with: pulumi config rm {shown(text)}")
        elif namespace == "hyperstack" and text not in HYPERSTACK_KEYS:
            near = close_match(text, HYPERSTACK_KEYS)
            hint = f" (did you mean {near}?)" if near else ""
            problems.append(f"{shown(text)} is not a Hyperstack provider setting{hint}; known: "
                            f"{', '.join(HYPERSTACK_KEYS)}")
    retry = values.get(RETRY_BASE_CONFIG) if isinstance(values, Mapping) else None
    if retry is not None:
        problem = retry_base_problem(retry)
        if problem:
            problems.append(f"{RETRY_BASE_CONFIG} {problem}")
    return problems
