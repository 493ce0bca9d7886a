"""kimi-cluster:schedule, working hours: windows by weekday and time in a named time zone, each with the replicas it
wants. Outside every window the caretaker has deleted the GPU VMs (kimi_cluster/node/caretaker_hours.py), and
`kimi-cluster schedule` (kimi_cluster/operator/scheduler.py) brings them back one bring-up ahead of the next window.

Parsed by pydantic (the shape, the clock times, the weekday names) and zoneinfo (the zone); `schedule` returns the
compiled form kimi_cluster/node/working_hours.py reads, or raises ValueError naming the key's path, e.g.
`schedule.windows[1].start`. Overlaps are refused here; the bound on replicas needs the stack's, so it is `problems`.
"""

from __future__ import annotations

from datetime import time
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from kimi_cluster.node.working_hours import DAYS
from kimi_cluster.settings import catalog
from kimi_cluster.settings.errors import shown
from kimi_cluster.settings.keys import NAMESPACE

KEY = "schedule"
Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
EXAMPLE = ('\'{"timeZone": "Europe/Berlin", "windows": [{"days": ["mon", "tue", "wed", "thu", "fri"], '
           '"start": "08:00", "end": "19:00", "replicas": 2}]}\'')
WINDOWS_MAX = 7 * 24  # an hour a window at the finest: bounds the overlap check and the messages


class Window(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    days: list[Day] = Field(min_length=1, max_length=7)
    start: time
    end: time
    replicas: int | None = Field(None, ge=1, le=catalog.MAX_REPLICAS)

    @field_validator("start", "end", mode="before")
    @classmethod
    def _hh_mm(cls, v: Any) -> Any:
        """"08:00": whole minutes of the zone's wall clock (pydantic reads the time; seconds are no schedule's)."""
        if not isinstance(v, str) or len(v) != 5 or v[2] != ":":
            raise ValueError(f"{shown(v)} is not a time of day as HH:MM, e.g. \"08:00\"")
        return time.max if v == "24:00" else v  # the day's end, as an end: a window up to midnight

    @model_validator(mode="after")
    def _order(self) -> Window:
        if len(set(self.days)) != len(self.days):
            raise ValueError(f"days {self.days} names a day twice")
        if self.end <= self.start:
            raise ValueError(f"end {self.end:%H:%M} is not after start {self.start:%H:%M}: a window ends on the day "
                             "it starts (a night shift is two windows, one ending 24:00 and one starting 00:00)")
        if self.start == time.max:
            raise ValueError("start 24:00 is the day's end; a window starting at midnight starts at 00:00")
        return self


class Schedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    time_zone: str = Field(alias="timeZone")
    windows: list[Window] = Field(min_length=1, max_length=WINDOWS_MAX)
    # The sandbox's clock: from this Unix time on, the schedule's minutes are caretakerTiming's shortened minutes;
    # allowed only with that test clock (problems).
    test_clock_epoch: float | None = Field(None, alias="testClockEpoch", gt=0)
    # A keyed request outside the hours may ask for the cluster early (the front records it, the scheduler starts
    # an up within the budget: kimi_cluster/node/caretaker_early.py); off, nothing of it is deployed.
    early_start: StrictBool = Field(False, alias="earlyStart")

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{shown(v)} is not a time zone the IANA database names, e.g. \"Europe/Berlin\" or "
                             "\"America/New_York\" (an offset such as +01:00 has no daylight saving time)") from None
        return v


def _minutes(moment: time) -> int:
    return 1440 if moment == time.max else moment.hour * 60 + moment.minute


def _clock(moment: time) -> str:
    return "24:00" if moment == time.max else f"{moment:%H:%M}"


def _where(loc: tuple[Any, ...]) -> str:
    """pydantic's location as the key's path below kimi-cluster:schedule, e.g. windows[1].start."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path.lstrip(".") or "(the object)"


def _overlaps(windows: list[Window]) -> list[str]:
    spans = [(DAYS.index(day) * 1440 + _minutes(w.start), DAYS.index(day) * 1440 + _minutes(w.end), i, day)
             for i, w in enumerate(windows) for day in w.days]
    out: list[str] = []
    spans.sort()
    reach: tuple[int, int] | None = None  # the furthest end so far, and its window
    for start, end, index, day in spans:
        if reach is not None and start < reach[0] and index != reach[1]:
            out.append(f"windows[{index}] overlaps windows[{reach[1]}] on {day}: each "
                       "moment belongs to one window at most (two windows that meet, 12:00 and 12:00, are fine)")
        if reach is None or end > reach[0]:
            reach = (end, index)
    return out


def schedule(v: Any) -> dict[str, Any] | None:
    """The compiled schedule, or None when unset; text is read as JSON (pulumi config's form)."""
    from kimi_cluster.settings.rules import json_text_object

    if v is None or v == "":
        return None
    expected = f"{shown(v)} is not a JSON object such as {EXAMPLE}"
    raw = json_text_object(v, expected)
    if not isinstance(raw, dict):
        raise ValueError(expected)
    try:
        parsed = Schedule.model_validate(raw)
    except ValidationError as err:
        raise ValueError("; ".join(f"{_where(e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                                   for e in err.errors()[:5])) from None
    overlaps = _overlaps(parsed.windows)
    if overlaps:
        raise ValueError("; ".join(overlaps[:5]))
    return {"time_zone": parsed.time_zone,
            "windows": [{"days": [DAYS.index(d) for d in w.days], "start": _clock(w.start),
                         "end": _clock(w.end), "replicas": w.replicas} for w in parsed.windows]} \
        | ({"test_clock_epoch": parsed.test_clock_epoch} if parsed.test_clock_epoch else {}) \
        | ({"early_start": True} if parsed.early_start else {})


def with_stack(compiled: dict[str, Any], stack_replicas: int, minute_seconds: float) -> dict[str, Any]:
    """The form the caretaker and the scheduler read: a window without `replicas` wants the stack's; a test clock's
    minutes are the caretaker's."""
    out = {"time_zone": compiled["time_zone"],
           "windows": [{**w, "replicas": w["replicas"] or stack_replicas} for w in compiled["windows"]]}
    if compiled.get("test_clock_epoch"):
        out["clock"] = {"epoch": compiled["test_clock_epoch"], "scale": 60 / minute_seconds}
    if compiled.get("early_start"):
        out["early_start"] = True
    return out


def problems(compiled: dict[str, Any] | None, stack_replicas: int, key_set: bool,
             minute_seconds: float = 60.0) -> list[str]:
    """A window may ask fewer replicas than the stack's `replicas` (what its front, quota and names were sized for),
    never more; one replica has no front, so a stack with one cannot be scaled to two by a window, nor the reverse.
    The stop is the caretaker's, with its own key."""
    if compiled is None:
        return []
    out = []
    if compiled.get("test_clock_epoch") and minute_seconds >= 60:
        out.append(f"{NAMESPACE}:{KEY}.testClockEpoch runs the schedule on the sandbox's shortened minutes; it needs "
                   f"that test clock ({NAMESPACE}:caretakerTiming.minuteSeconds below 60, with an emulator as "
                   "caretakerApiUrl), and a real stack keeps the wall clock")
    if not key_set:
        out.append(f"{NAMESPACE}:caretakerApiKey is required with {NAMESPACE}:{KEY}: at a window's end the caretaker "
                   "deletes the GPU VMs with a Hyperstack API key of its own; set it with: pulumi config set "
                   f"--secret {NAMESPACE}:caretakerApiKey <key>")
    if compiled.get("early_start") and stack_replicas == 1:
        out.append(f"{NAMESPACE}:{KEY}.earlyStart needs a front ({NAMESPACE}:replicas 2 or more): outside the hours "
                   "a stack of one replica has no endpoint left to take the ask (the caretaker deletes the head it "
                   "runs on, proxy and all)")
    for i, window in enumerate(compiled["windows"]):
        wanted = window["replicas"]
        if wanted is None:
            continue
        if wanted > stack_replicas:
            out.append(f"{NAMESPACE}:{KEY}.windows[{i}].replicas {wanted} is more than the stack is sized for "
                       f"({NAMESPACE}:replicas {stack_replicas}); raise replicas, or ask at most {stack_replicas}")
        elif (wanted == 1) != (stack_replicas == 1):
            out.append(f"{NAMESPACE}:{KEY}.windows[{i}].replicas {wanted}: a stack of {stack_replicas} replicas "
                       "serves through its front, which one replica has not (its endpoint would move); ask 2 or more")
    return out
