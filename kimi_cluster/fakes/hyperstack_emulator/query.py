"""Query parameters and paging, as the API reads them."""

from __future__ import annotations

from typing import TypeVar

from .state import ApiError

T = TypeVar("T")


def q(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def page(items: list[T], query: dict[str, list[str]], size_param: str,
         default_size: int | None) -> tuple[list[T], int | None, int | None]:
    """Slice like the API: 1-based `page`; without paging parameters the page fields echo null."""
    page_raw, size_raw = q(query, "page"), q(query, size_param)
    try:
        number = int(page_raw) if page_raw else None
        size = int(size_raw) if size_raw else default_size
    except ValueError:
        raise ApiError(400, "bad_request", f"page and {size_param} must be integers") from None
    if size is None:
        return items, number, None
    if size < 1 or (number is not None and number < 1):
        raise ApiError(400, "bad_request", f"page and {size_param} must be positive")
    start = ((number or 1) - 1) * size
    return items[start:start + size], number or 1, size
