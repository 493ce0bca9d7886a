"""Runs a Pulumi Python program to completion against the sandbox monitor, as the Python language host does.

Mirrors pulumi-language-python-exec: configure the runtime, set the config, chdir, then await
`run_in_stack(runpy.run_path(program_dir))` on a fresh event loop. The runtime's state is process-global.

`pulumi.runtime.set_mocks` is not used: it creates the root Stack and registers its (empty) outputs at once,
so later `pulumi.export`s would never reach the monitor. Configuring Settings with the monitor object and
running the program inside `run_in_stack` registers the stack's outputs after the program, as `pulumi up` does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import runpy
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pulumi.runtime
from pulumi.runtime.stack import run_in_stack

from .config import Project, StackConfig


class ProgramTimeout(Exception):
    """The program's run passed its deadline and was cancelled."""


def run_program(
    project: Project,
    stack: str,
    config: StackConfig,
    monitor: Any,
    engine: Any,
    parallel: int,
    deadline: float,
    before_close: Callable[[], None] = lambda: None,
) -> None:
    """Run the program; raises whatever the program (or a failed resource it awaited) raised.

    `deadline` (seconds) bounds the whole run: a program whose outputs never settle is cancelled, not waited on.

    `before_close` runs before the event loop closes: monitor calls still running in the executor (possible after a
    failure) must finish while the loop can still take their results.
    """
    pulumi.runtime.set_all_config(dict(config.values), sorted(config.secret_keys))
    pulumi.runtime.configure(
        pulumi.runtime.Settings(
            project=project.name,
            stack=stack,
            monitor=monitor,
            engine=engine,
            parallel=parallel,
            dry_run=False,
            organization="organization",
            root_directory=str(project.directory),
        )
    )
    # As the language host does: unobserved futures of a failed deployment are expected, not news.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    previous_cwd = os.getcwd()
    previous_argv = sys.argv
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # The SDK calls the monitor from the loop's default executor and each call blocks while its resource is
    # performed, so the pool size is the deployment's parallelism (the stock pool is cpu_count + 4).
    executor = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="pulumi-monitor")
    loop.set_default_executor(executor)
    try:
        os.chdir(project.program_dir)
        sys.argv = [str(project.program_dir)]
        program_dir = str(project.program_dir)
        def program() -> None:
            runpy.run_path(program_dir, run_name="__main__")

        run = run_in_stack(program)
        try:
            loop.run_until_complete(asyncio.wait_for(run, timeout=deadline))
        except TimeoutError:
            raise ProgramTimeout(f"the program did not finish within {deadline:.0f}s") from None
    finally:
        os.chdir(previous_cwd)
        sys.argv = previous_argv
        before_close()
        executor.shutdown(wait=False, cancel_futures=True)
        loop.close()
        asyncio.set_event_loop(None)
