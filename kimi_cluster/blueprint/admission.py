"""What the plan refuses on top of the settings' own rules, before anything is built or billed.

The settings check each key and the rules across keys (kimi_cluster/settings/); what only the plan knows is checked
here: the engine flags the program's command line owns (kimi_cluster/plan/launch.py), which extraEngineArgs may not
set, nor, while streams resume, a chat-layer flag the front's render server cannot follow (chat_layer.py), and what
the step table (kimi_cluster/plan/steps/table.py) says of stepDeadlineMinutes and nodeTiming: the step names, the
cache steps' floor, and no default deadline past a week. The program, `kimi-cluster plan` and
`kimi-cluster status` admit their settings through `admit`. It sits in the blueprint, the one reader of the
settings below the program's entry.
"""

from __future__ import annotations

import math

from kimi_cluster.blueprint.inputs import engine_inputs, resolved_timing, stack_shape
from kimi_cluster.plan import chat_layer, launch
from kimi_cluster.plan.steps.clocks import deadline_s
from kimi_cluster.plan.steps.resolve import resolve_vms
from kimi_cluster.plan.steps.table import BY_NAME, CACHE_STEP_NAMES, NAMES, TABLE
from kimi_cluster.settings import CACHE_STEP_MIN_MINUTES, DURATION_MAX_MINUTES, NAMESPACE, Settings, SettingsError
from kimi_cluster.settings.errors import shown
from kimi_cluster.settings.loader import refusal
from kimi_cluster.settings.node_timing import TIMEOUT_MIN_S
from kimi_cluster.settings.timing import Timing


def floor_minutes(step: str, settings: Settings) -> int:
    """The least stepDeadlineMinutes `step` takes: its own work's floor (the step table's), in whole minutes; 0 for
    a step without one."""
    floor = BY_NAME[step].floor
    return math.ceil(floor.seconds(stack_shape(settings)) / 60) if floor else 0


def floor_problem(step: str, minutes: float, settings: Settings) -> str | None:
    """Why `minutes` is too short for `step`'s own work, or None."""
    floor, need = BY_NAME[step].floor, floor_minutes(step, settings)
    if floor is None or minutes >= need:
        return None
    return (f"{minutes:g} minutes is shorter than the {need} its own work takes ({floor.work}, by the plan's timing "
            f"model, kimi_cluster/settings/work_model.py): stopped mid-way, it fails `up`; at least {need}")


def step_deadline_problems(settings: Settings) -> list[str]:
    """stepDeadlineMinutes against the table: each key a step, a cache step's deadline room for its S3 client."""
    key = f"{NAMESPACE}:stepDeadlineMinutes"
    problems = []
    for step, minutes in settings.step_deadline_minutes.items():
        if step not in NAMES:
            problems.append(f"{key}: {shown(step)} is not a node step; steps are {', '.join(NAMES)}")
        elif floor_problem(step, minutes, settings):
            problems.append(f"{key}: {step}: {floor_problem(step, minutes, settings)}")
        elif step in CACHE_STEP_NAMES and minutes < CACHE_STEP_MIN_MINUTES:
            problems.append(f"{key}: {step}: {shown(minutes)} minutes is shorter than {CACHE_STEP_MIN_MINUTES:g}: "
                            f"{step} first installs its S3 client, and its deadline must leave that, its slack and "
                            "a minute of transfer, or the step fails `up`")
    warmup = settings.step_deadline_minutes.get("warmup")
    docker_s = settings.timing.docker_timeout_s
    if warmup and warmup * 60 < docker_s + TIMEOUT_MIN_S:
        # The warm-up gives up inside its own deadline and then removes its container (up to dockerTimeoutS): a
        # deadline that leaves it no time of its own stops it in the middle of `docker rm`.
        problems.append(f"{key}: warmup: {warmup:g} minutes leaves the warm-up less than {TIMEOUT_MIN_S} s of its "
                        f"own beside nodeTiming.dockerTimeoutS ({docker_s} s, its container's removal); at least "
                        f"{(docker_s + TIMEOUT_MIN_S) / 60:g}")
    return problems


def node_timing_problems(settings: Settings) -> list[str]:
    """nodeTiming as a whole: no step's deadline past the week stepDeadlineMinutes allows (unless the defaults'
    own already is, with a week-long downloadTimeoutMinutes), for the steps this stack runs that stepDeadlineMinutes
    leaves to it."""
    problems = []
    timing = resolved_timing(settings)
    runs = {plan.step for vm in resolve_vms(stack_shape(settings), timing, "admission") for plan in vm.steps}
    for step, keys in ((s.name, s.timing_keys) for s in TABLE if s.timing_keys and s.name in runs):
        if settings.step_deadline_minutes.get(step):
            continue  # its own deadline bounds it
        limit = max(DURATION_MAX_MINUTES * 60, deadline_s(step, resolved_timing(settings, Timing())))
        deadline = deadline_s(step, timing)
        if deadline > limit:
            problems.append(f"{NAMESPACE}:nodeTiming makes the {step} step's deadline {deadline / 3600:,.1f} h "
                            f"({keys}, plus deadlineSlackS), past the week ({DURATION_MAX_MINUTES} minutes) "
                            f"{NAMESPACE}:stepDeadlineMinutes allows; shorten them")
    return problems


def problems(settings: Settings) -> list[str]:
    """Every reason the plan refuses these settings, each naming its key; none for a stack it can build."""
    found = step_deadline_problems(settings)
    if found:
        return found  # a deadline of an unknown step has no rule to weigh nodeTiming against
    return (launch.engine_arg_problems(engine_inputs(settings))
            + chat_layer.chat_layer_problems(settings.resumes_streams, settings.extra_engine_args,
                                               settings.engine_name)
            + node_timing_problems(settings))


def admit(settings: Settings) -> Settings:
    """`settings`, or a SettingsError in the loader's shape naming every problem the plan finds."""
    found = problems(settings)
    if found:
        # One line, as the model's cross-key rules report theirs (the error's bound cuts it as one).
        raise SettingsError(refusal(["\n  ".join(found)]))
    return settings
