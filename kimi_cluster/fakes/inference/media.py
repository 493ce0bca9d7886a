"""An image given by http(s) URL, as vLLM 0.33.0 fetches one, and the answer it gives when the fetch fails.

vLLM fetches the URL itself (vllm/multimodal/media/connector.py, `load_from_url_async`, within
VLLM_IMAGE_FETCH_TIMEOUT, 5 s by default). An origin's 4xx other than 408 and 429 becomes a 422 naming `image_url`
(`_wrap_media_fetch_error`); anything else (an origin's 5xx, 408 or 429, a refused connection, a name that does not
resolve, a timeout) is raised as it is, and the server's last-resort handler answers it with a 500
(vllm/entrypoints/serve/exception_handling/error_response.py: an exception of no known kind is an
InternalServerError). So a key holder can make an engine answer 500 at will, with a URL nothing answers.

The fake fetches only from loopback (its own machine, which in the sandbox is the fake node's namespace): any other
host is answered as an unreachable one is, and nothing outside is ever asked.
"""

from __future__ import annotations

import http.client
import ipaddress
from urllib.parse import urlsplit

from .settings import HttpError

FETCH_TIMEOUT_S = 5.0  # vLLM's VLLM_IMAGE_FETCH_TIMEOUT default (vllm/envs.py)
MAX_IMAGE_BYTES = 16 * 1024 * 1024  # more than any image the fake's checks send; read no further


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def fetch_image(url: str) -> bytes:
    """The bytes at an http(s) URL, or the HttpError vLLM answers when it cannot have them."""
    parts = urlsplit(url)
    try:
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port that is not a number
        raise HttpError(422, "Failed to fetch media from URL: Invalid URL format") from None
    where = f"{host}:{port} ssl:{'default' if parts.scheme == 'https' else 'False'}"
    if not _loopback(host):
        # aiohttp's words for a host it cannot connect to (ClientConnectorError), as vLLM passes them on.
        raise HttpError(500, f"Cannot connect to host {where} [the fake engine fetches from loopback only]")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(host, port, timeout=FETCH_TIMEOUT_S)
    try:
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        answer = connection.getresponse()
        data = answer.read(MAX_IMAGE_BYTES + 1)
    except TimeoutError:
        raise HttpError(500, f"Connection timeout to host {url}") from None
    except (OSError, http.client.HTTPException) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise HttpError(500, f"Cannot connect to host {where} [{reason}]") from None
    finally:
        connection.close()
    if 400 <= answer.status < 500 and answer.status not in (408, 429):
        raise HttpError(422, f"Failed to fetch media from URL: HTTP {answer.status} error")
    if 300 <= answer.status < 400:  # vLLM follows it (VLLM_MEDIA_URL_ALLOW_REDIRECTS); the fake leaves loopback never
        raise HttpError(500, f"{answer.status} from {url}: the fake engine follows no redirect")
    if answer.status != 200:  # aiohttp's ClientResponseError, as vLLM passes it on
        raise HttpError(500, f"{answer.status}, message='{answer.reason}', url='{url}'")
    if len(data) > MAX_IMAGE_BYTES:
        raise HttpError(400, f"the image at image_url is larger than {MAX_IMAGE_BYTES} bytes")
    return data
