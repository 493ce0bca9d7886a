"""The settings compiled into the node steps' frozen inputs, once: `compile_steps` fills each step's input type (the
step table names it, kimi_cluster/plan/steps/table.py) from Settings, with the stack's shape and resolved timing.

Most inputs copy the settings' values of the same names (`_same_names`): an input field named `model_revision` is
`settings.model_revision`. What is worked out (the kernel cache's key, the launch identity, the caretaker's
configuration) is worked out here, so that nothing below reads the settings.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from kimi_cluster.blueprint.caretaker import caretaker_inputs
from kimi_cluster.plan import kernel_cache
from kimi_cluster.plan.endpoint import ReadinessInputs, readiness_identity
from kimi_cluster.plan.engine_steps import LaunchInputs, WarmupInputs
from kimi_cluster.plan.firewall import FirewallInputs
from kimi_cluster.plan.launch import EngineInputs
from kimi_cluster.plan.proxy import EndpointInputs
from kimi_cluster.plan.resume import ResumeInputs
from kimi_cluster.plan.step_scripts import CommonInputs
from kimi_cluster.plan.steps.model import CompiledSteps, StackShape
from kimi_cluster.plan.steps.resolve import resolve_vms
from kimi_cluster.plan.vm_prep import ImageInputs, NoInputs, ReadyInputs, StorageInputs
from kimi_cluster.plan.weights_download import CheckInputs, WeightsInputs
from kimi_cluster.settings import Settings
from kimi_cluster.settings.timing import Timing

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def _same_names(cls: type[T], settings: Settings, **worked_out: Any) -> T:
    """`cls` with each field the settings' value of the same name, unless `worked_out` gives it."""
    return cls(**{f.name: worked_out[f.name] if f.name in worked_out else getattr(settings, f.name)
                  for f in dataclasses.fields(cls)})


def fan_out_size(settings: Settings) -> int:
    """How many nodes share one download: the replica's, or behind a front every GPU node of every replica (a
    re-created replica then fetches from its twin's disks, and a first bring-up takes each file from the hub once)."""
    return settings.nodes * settings.replicas if settings.has_front else settings.nodes


def stack_shape(settings: Settings) -> StackShape:
    return StackShape(
        nodes=settings.nodes, replicas=settings.replicas, has_front=settings.has_front,
        resumes_streams=settings.resumes_streams, kernel_cache=settings.kernel_cache is not None,
        kernel_warmup=settings.kernel_warmup, guarded=settings.guarded, fan_out=fan_out_size(settings),
        node_names=tuple(tuple(settings.replica_node_name(r, n) for n in range(settings.nodes))
                         for r in range(settings.replicas)),
        front_name=settings.front_name)


def resolved_timing(settings: Settings, timing: Timing | None = None) -> Timing:
    """`timing` (default: nodeTiming's, Settings.timing) with what other keys decide filled in: the download and
    readiness waits (downloadTimeoutMinutes, readinessTimeoutMinutes, unless it sets them), stepDeadlineMinutes and
    kernelCache's transfer minutes."""
    timing = settings.timing if timing is None else timing
    cache = settings.kernel_cache
    return dataclasses.replace(
        timing,
        download_timeout_s=timing.download_timeout_s or settings.download_timeout_minutes * 60,
        readiness_timeout_s=timing.readiness_timeout_s or settings.readiness_timeout_minutes * 60,
        step_deadline_minutes=dict(settings.step_deadline_minutes),
        cache_restore_minutes=cache.restore_timeout_minutes if cache else 0,
        cache_save_minutes=cache.save_timeout_minutes if cache else 0)


def engine_inputs(settings: Settings) -> EngineInputs:
    return _same_names(EngineInputs, settings, extra_engine_args=tuple(settings.extra_engine_args))


def endpoint_inputs(settings: Settings) -> EndpointInputs:
    return _same_names(EndpointInputs, settings, hours=settings.schedule is not None,
                       early_start=bool((settings.schedule or {}).get("early_start")))


def firewall_inputs(settings: Settings) -> FirewallInputs:
    return _same_names(FirewallInputs, settings, api_cidrs=tuple(settings.api_cidrs))


def resume_inputs(settings: Settings) -> ResumeInputs:
    return _same_names(ResumeInputs, settings, extra_engine_args=tuple(settings.extra_engine_args))


def readiness_inputs(settings: Settings) -> ReadinessInputs:
    return ReadinessInputs(engine_inputs(settings), endpoint_inputs(settings), settings.api_hostname)


def kernel_cache_inputs(settings: Settings) -> kernel_cache.KernelCacheInputs | None:
    cfg = settings.kernel_cache
    if cfg is None:
        return None
    return kernel_cache.KernelCacheInputs(
        engine_name=settings.engine_name, key=kernel_cache.cache_key(engine_inputs(settings)),
        location=cfg.location, bucket=cfg.bucket, prefix=cfg.prefix, endpoint_url=cfg.endpoint_url or "",
        region=cfg.region, addressing_style=cfg.addressing_style,
        launch_identity=readiness_identity(readiness_inputs(settings)))


def step_inputs(settings: Settings) -> dict[str, Any]:
    """Every step's inputs by name, whether or not this stack runs it (a step that needs a key it lacks is left out:
    the cache steps without kernelCache)."""
    engine = engine_inputs(settings)
    spec = settings.model_spec
    cache = kernel_cache_inputs(settings)
    found: dict[str, Any] = {
        "ready": ReadyInputs(settings.gpus_per_node_count),
        "storage": StorageInputs(settings.engine_name, spec.checkpoint_bytes, settings.disk_margin_gb),
        "image": _same_names(ImageInputs, settings),
        "weights": _same_names(WeightsInputs, settings, checkpoint_bytes=spec.checkpoint_bytes,
                               fan_out=fan_out_size(settings)),
        "warmup": WarmupInputs(engine, settings.gpus_per_node_count, cache.key.id if cache else ""),
        "check": _same_names(CheckInputs, settings),
        "launch": LaunchInputs(engine, settings.gpus_per_node_count, settings.kernel_warmup),
        "front-ready": NoInputs(),
        "resume": resume_inputs(settings),
        "proxy": endpoint_inputs(settings),
        "readiness": readiness_inputs(settings),
        "engine-ready": readiness_inputs(settings),
        "caretaker": caretaker_inputs(settings),
    }
    if cache is not None:
        found.update({"cache-restore": cache, "cache-save": cache})
    return found


def compile_steps(settings: Settings, timing: Timing | None = None) -> CompiledSteps:
    """The node steps compiled for this stack: its shape, its resolved timing, and the inputs of each step it runs
    on some VM. `timing` (tests shorten it) defaults to the stack's own."""
    shape = stack_shape(settings)
    resolved = resolved_timing(settings, timing)
    runs = {s.step for vm in resolve_vms(shape, resolved, "kimi") for s in vm.steps}
    inputs = {name: value for name, value in step_inputs(settings).items() if name in runs}
    return CompiledSteps(shape, resolved, CommonInputs(settings.node_root, settings.storage_path), inputs)
