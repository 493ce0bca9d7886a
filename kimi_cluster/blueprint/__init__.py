"""The blueprint: the one reader of the settings below the program's entry (kimi_cluster/deploy/program.py).

`blueprint(settings, name)` works out, once, everything the stack is made of as plain frozen data (stack.py): its
VMs, rules, certificate, outputs, and the node steps compiled (inputs.py: each step's frozen inputs, the stack's
shape, its resolved timing). Below it (kimi_cluster/plan/, kimi_cluster/deploy/) nothing takes the settings.
It also holds what reads them for that: what the plan refuses (admission.py), the cost (pricing.py), the
caretaker's configuration (caretaker.py), and for the tests and tools the scripts of a stack (scripts.py).
"""

from kimi_cluster.blueprint.scripts import render_front_step, render_node_scripts, render_step
from kimi_cluster.blueprint.stack import Blueprint, blueprint

__all__ = ["Blueprint", "blueprint", "render_front_step", "render_node_scripts", "render_step"]
