#!/usr/bin/env bash
# The engines' own argument parsers, from pinned wheels, in a virtualenv of their own (default .venv-parsers): vLLM
# with its dependencies (torch among them, about 9 GB and 7 minutes from a cold cache on 2 cores), then TokenSpeed
# 0.1.1 and the smg gateway it pins, and SGLang 0.5.23, without theirs (their GPU kernels cannot load here, and
# their parsers need none of them). tests/engine_parsers/test_engine_parsers.py runs probe.py with this interpreter.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${KIMI_PARSERS_VENV:-.venv-parsers}"
bash scripts/venv.sh "$venv"
"$venv/bin/pip" install -q -r tests/engine_parsers/requirements-vllm.txt
"$venv/bin/pip" install -q --no-deps -r tests/engine_parsers/requirements-tokenspeed.txt
"$venv/bin/pip" install -q --no-deps -r tests/engine_parsers/requirements-sglang.txt
