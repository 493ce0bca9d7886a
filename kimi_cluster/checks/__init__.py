"""Post-deploy checks of a Kimi K3.1 Pro endpoint (OpenAI and Anthropic routes), as plain functions.

Each check returns a CheckResult, never raises; used by kimi_cluster/cli/verify.py and the
verification stack (verification/). Modules, one concern each:

- target: what to check (endpoint, model, key, total time per check) and the defaults;
- results: CheckResult, VerificationOutcome, CheckFailed, VerificationFailed;
- client: the HTTP client (Api): answers capped in size, which key a request carries (RequestKey),
  a chat reply (ChatReply);
- deadline: one total deadline per check, however slowly a server trickles;
- checks/: one module per check or small group, and the CHECKS registry in canonical order;
- runner: run_check, run_checks, verify, select_checks;
- stack: what the verification stack records (run_stack_checks);
- prompts, tools, arithmetic, png, messages, text: what the checks send and how they quote answers.

Named endpoint_checks, not verification: verification/ is the verification stack's own Pulumi project, whose
`checks_resource` module (a pickled provider) imports this library; one name for both read as one package.
"""

from __future__ import annotations

from kimi_cluster.checks.arithmetic import safe_arithmetic
from kimi_cluster.checks.endpoint_checks import CHECK_NAMES, CHECKS
from kimi_cluster.checks.messages import REASONING_FIELDS, assistant_turn, reasoning_of
from kimi_cluster.checks.png import make_split_png
from kimi_cluster.checks.results import CheckFailed, CheckResult, VerificationFailed, VerificationOutcome
from kimi_cluster.checks.runner import run_check, run_checks, select_checks, verify
from kimi_cluster.checks.stack import STACK_REPLACE_KEYS, STACK_UPDATE_KEYS, run_stack_checks
from kimi_cluster.checks.target import API_KEY_ENV, DEFAULT_MODEL, DEFAULT_TIMEOUT_S, Target, normalize_base_url
from kimi_cluster.checks.text import redact, redact_obj

__all__ = [
    "API_KEY_ENV",
    "CHECKS",
    "CHECK_NAMES",
    "DEFAULT_MODEL",
    "DEFAULT_TIMEOUT_S",
    "REASONING_FIELDS",
    "STACK_REPLACE_KEYS",
    "STACK_UPDATE_KEYS",
    "CheckFailed",
    "CheckResult",
    "Target",
    "VerificationFailed",
    "VerificationOutcome",
    "assistant_turn",
    "make_split_png",
    "normalize_base_url",
    "reasoning_of",
    "redact",
    "redact_obj",
    "run_check",
    "run_checks",
    "run_stack_checks",
    "safe_arithmetic",
    "select_checks",
    "verify",
]
