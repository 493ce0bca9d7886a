"""What the plan refuses on top of the settings' own rules, before anything is built or billed.

The settings check each key and the rules across keys (kimi_cluster/settings/); what only the plan knows is checked
here: the engine flags the program's command line owns (kimi_cluster/plan/launch.py), which extraEngineArgs may not
set. The program, `kimi-cluster plan` and `kimi-cluster status` admit their settings through `admit`.
"""

from __future__ import annotations

from kimi_cluster.plan import launch
from kimi_cluster.settings import Settings, SettingsError
from kimi_cluster.settings.loader import refusal


def problems(settings: Settings) -> list[str]:
    """Every reason the plan refuses these settings, each naming its key; none for a stack it can build."""
    return launch.engine_arg_problems(settings)


def admit(settings: Settings) -> Settings:
    """`settings`, or a SettingsError in the loader's shape naming every problem the plan finds."""
    found = problems(settings)
    if found:
        # One line, as the model's cross-key rules report theirs (the error's bound cuts it as one).
        raise SettingsError(refusal(["\n  ".join(found)]))
    return settings
