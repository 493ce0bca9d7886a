"""A live stack upgrades without change: the program's URNs, parents, component types, dependencies, timeouts,
every remote command's text (its script byte for byte) and its secret stdin are what the recorded fixtures hold
(tests/fixtures/step_graph/, written by `python -m tests.plan.graph_record` from the code before the step table).
"""

from __future__ import annotations

import json

import pytest

from tests.plan.graph_record import FIXTURES, STACKS, graph, run_stack, scripts


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_the_graph_is_the_recorded_one(stack: str) -> None:
    want = json.loads((FIXTURES / f"{stack}.json").read_text())
    got = graph(run_stack(stack))
    assert sorted(got) == sorted(want), "the URNs changed"
    changed = {urn: (got[urn], want[urn]) for urn in want if got[urn] != want[urn]}
    assert not changed, f"{len(changed)} resources changed: " + json.dumps(changed, indent=1)[:4000]


# Linux's limit on one argument (MAX_ARG_STRLEN, 32 pages): a remote command's text is handed to bash as one, and a
# longer one fails on the node with "Argument list too long" (the weights step, once it shipped the range fetcher
# as heredocs, did on every node of h100x4-sglang).
ONE_ARGUMENT = 32 * 4096


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_command_fits_in_one_argument(stack: str) -> None:
    sizes = {name: len(text.encode()) for name, text in scripts(run_stack(stack)).items()}
    too_long = {name: size for name, size in sizes.items() if size >= ONE_ARGUMENT}
    assert not too_long, too_long
