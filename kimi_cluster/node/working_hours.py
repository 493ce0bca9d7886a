"""Working hours (kimi-cluster:schedule): which window is open at a moment, when the next one opens, when the last one
closed. The one home of this arithmetic: the caretaker on the VM (caretaker_hours.py), the scheduler, `plan` and
`status` all read it. Stdlib only (it ships to the VM beside the caretaker).

A schedule's compiled form (kimi_cluster/settings/schedule_rules.py makes it from the stack's config):
`{"time_zone": "Europe/Berlin", "windows": [{"days": [0, 1, 2, 3, 4], "start": "08:00", "end": "19:00",
"replicas": 2}]}`, days counted from Monday (0), times the zone's wall clock. A window's times are read in the zone on
each day it opens, so a change of daylight saving time moves it with the team's clocks, as zoneinfo resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_LOOK_DAYS = 8  # a week and a day either side: every weekly window has an occurrence in it


@dataclass(frozen=True)
class Opening:
    """One window on one day: its start and end as aware datetimes, and the replicas it wants."""

    start: datetime
    end: datetime
    replicas: int
    index: int  # its place in the schedule's windows, for messages

    def describe(self) -> str:
        return (f"{DAYS[self.start.weekday()]} {self.start:%H:%M}-{self.end:%H:%M} {self.start.tzname()} "
                f"({self.replicas} replica{'s' if self.replicas != 1 else ''})")


def _minutes(text: str) -> int:
    """"08:00" as minutes into the day; "24:00" (an end only) is the day's end."""
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def _on(day: date, text: str, zone: ZoneInfo) -> datetime:
    """The wall-clock time `text` of `day` in `zone`; 24:00 is the next day's 00:00."""
    minutes = _minutes(text)
    return datetime.combine(day + timedelta(days=minutes // 1440), time(minutes % 1440 // 60, minutes % 60), zone)


def _scaled(schedule: dict[str, Any]) -> tuple[float, float] | None:
    """The sandbox's test clock: (epoch, scale), schedule time running `scale` times faster than real time from
    `epoch` (kimi_cluster/settings/schedule_rules.py allows it only with a shortened caretaker minute)."""
    clock = schedule.get("clock")
    return (float(clock["epoch"]), float(clock["scale"])) if clock else None


def _to_schedule(schedule: dict[str, Any], moment: datetime) -> datetime:
    scaled = _scaled(schedule)
    if scaled is None:
        return moment
    epoch, scale = scaled
    return datetime.fromtimestamp(epoch + (moment.timestamp() - epoch) * scale, moment.tzinfo)


def _to_real(schedule: dict[str, Any], moment: datetime) -> datetime:
    scaled = _scaled(schedule)
    if scaled is None:
        return moment
    epoch, scale = scaled
    return datetime.fromtimestamp(epoch + (moment.timestamp() - epoch) / scale, moment.tzinfo)


def openings(schedule: dict[str, Any], around: datetime) -> list[Opening]:
    """Every window's occurrences from a week and a day before `around` to a week and a day after, by start, as
    real moments (on a test clock, mapped back from its schedule time)."""
    zone = ZoneInfo(schedule["time_zone"])
    local_day = _to_schedule(schedule, around).astimezone(zone).date()
    out = []
    for offset in range(-_LOOK_DAYS, _LOOK_DAYS + 1):
        day: date = local_day + timedelta(days=offset)
        for index, window in enumerate(schedule["windows"]):
            if day.weekday() not in window["days"]:
                continue
            out.append(Opening(_to_real(schedule, _on(day, window["start"], zone)),
                               _to_real(schedule, _on(day, window["end"], zone)), int(window["replicas"]), index))
    return sorted(out, key=lambda o: o.start)


def open_now(schedule: dict[str, Any], now: datetime) -> Opening | None:
    return next((o for o in openings(schedule, now) if o.start <= now < o.end), None)


def next_opening(schedule: dict[str, Any], now: datetime) -> Opening | None:
    """The first window that opens after `now` (None only for a schedule without a window, which is refused)."""
    return next((o for o in openings(schedule, now) if o.start > now), None)


def last_close(schedule: dict[str, Any], now: datetime) -> datetime | None:
    """When the latest window that has closed by `now` closed."""
    ends = [o.end for o in openings(schedule, now) if o.end <= now]
    return max(ends) if ends else None


def weekly_hours(schedule: dict[str, Any]) -> list[tuple[float, int]]:
    """Each window's hours a week with its replicas, as the wall clock counts them (no daylight saving change)."""
    out = []
    for window in schedule["windows"]:
        hours = (_minutes(window["end"]) - _minutes(window["start"])) / 60
        out.append((hours * len(window["days"]), int(window["replicas"])))
    return out


def utc_now() -> datetime:
    return datetime.now(UTC)


def http_date(moment: datetime) -> str:
    """A Retry-After value (RFC 9110's HTTP-date): a fixed moment, right however late the answer is read."""
    from email.utils import format_datetime

    return format_datetime(moment.astimezone(UTC), usegmt=True)
