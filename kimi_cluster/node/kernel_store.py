"""The kernel cache's store (run with kimi_cluster/node/kernel_cache.py on a node): the S3-compatible bucket through
boto3 (https://boto3.amazonaws.com/v1/documentation/api/latest/), a transfer's progress lines and its checksum.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kimi_cluster.node.kernel_files import ARCHIVE_NAME, CHUNK, MANIFEST_NAME, CacheError


@dataclass
class Store:
    """One bucket and prefix through boto3; errors become one-line CacheErrors that name the setting to check."""

    bucket: str
    prefix: str
    endpoint_url: str | None
    region: str
    addressing_style: str
    credentials_file: str
    client: Any = None

    @property
    def where(self) -> str:
        return self.place("")

    def place(self, key: str) -> str:
        at = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{key + '/' if key else ''}{at}"

    def connect(self) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise CacheError(f"boto3 is not installed on this node ({exc})") from None
        try:
            with open(self.credentials_file, encoding="utf-8") as fh:
                value = fh.read().strip()
        except OSError:
            value = ""
        key_id, sep, secret = value.partition(":")
        if not sep or not key_id or not secret:
            raise CacheError("no usable credentials: kimi-cluster:kernelCacheCredentials must be "
                             "ACCESS_KEY_ID:SECRET_ACCESS_KEY")
        config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 4, "mode": "standard"},
                        s3={"addressing_style": self.addressing_style})
        self.client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                                   aws_access_key_id=key_id, aws_secret_access_key=secret, config=config)

    def object_key(self, key: str, name: str) -> str:
        return f"{self.prefix}{key}/{name}"

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        try:
            return fn()
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise _Missing(what) from None
            if code == "NoSuchBucket":
                raise CacheError(f"bucket {self.bucket} does not exist at {self.where} "
                                 "(kimi-cluster:kernelCache.bucket)") from None
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidClientTokenId",
                        "403", "Forbidden") or status == 403:
                raise CacheError(f"the store refused the credentials ({code or status}) for {what} at {self.where}; "
                                 "check kimi-cluster:kernelCacheCredentials and the key's permissions") from None
            raise CacheError(f"the store answered {code or status} to {what} at {self.where}: "
                             f"{err.get('Message', '')}".rstrip(": ")) from None
        except EndpointConnectionError as exc:
            raise CacheError(f"the store at {self.where} is unreachable: {exc}") from None
        except BotoCoreError as exc:
            raise CacheError(f"{what} at {self.where} failed: {type(exc).__name__}: {exc}") from None

    def get_manifest(self, key: str) -> dict[str, Any] | None:
        name = self.object_key(key, MANIFEST_NAME)
        try:
            body = self._call(f"reading {name}", lambda: self.client.get_object(Bucket=self.bucket, Key=name))
        except _Missing:
            return None
        try:
            manifest = json.loads(body["Body"].read())
        except ValueError:
            raise CacheError(f"the manifest {name} is not JSON") from None
        if not isinstance(manifest, dict):
            raise CacheError(f"the manifest {name} is not a JSON object")
        return manifest

    def download(self, key: str, dest: str, progress: Callable[[int], None], size: int | None = None) -> None:
        """Fetch the archive; with `size`, refused before a byte is fetched if the object is of another size."""
        name = self.object_key(key, ARCHIVE_NAME)
        if size is not None:
            try:
                head = self._call(f"reading the size of {name}",
                                  lambda: self.client.head_object(Bucket=self.bucket, Key=name))
            except _Missing:
                raise CacheError(f"the manifest names {name}, but the archive is missing") from None
            length = head.get("ContentLength")
            if length != size:
                raise CacheError(f"the archive is {length:,} bytes, the manifest recorded {size:,}"
                                 if isinstance(length, int) else "the store gives no size for the archive")
        try:
            self._call(f"downloading {name}",
                       lambda: self.client.download_file(self.bucket, name, dest, Callback=progress))
        except _Missing:
            raise CacheError(f"the manifest names {name}, but the archive is missing") from None

    def upload(self, key: str, path: str, manifest: dict[str, Any], progress: Callable[[int], None]) -> None:
        name = self.object_key(key, ARCHIVE_NAME)
        self._call(f"uploading {name}", lambda: self.client.upload_file(
            path, self.bucket, name, Callback=progress, ExtraArgs={"ContentType": "application/gzip"}))
        body = json.dumps(manifest, indent=2, sort_keys=True).encode()
        mname = self.object_key(key, MANIFEST_NAME)
        self._call(f"writing {mname}", lambda: self.client.put_object(
            Bucket=self.bucket, Key=mname, Body=body, ContentType="application/json"))


class _Missing(Exception):
    pass


# ---- progress --------------------------------------------------------------------------------------------------------


class Progress:
    """Counts bytes from boto3's callbacks (several threads) and prints a line every `every` seconds."""

    def __init__(self, verb: str, total: int, every: float, limit: int | None = None) -> None:
        self.verb, self.total, self.every, self.limit = verb, total, every, limit
        self.done = 0
        self.last = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        if self.limit is not None and self.done > self.limit:
            # The object grew after its size was read: stop before it fills the disk.
            raise CacheError(f"the archive is more than the {self.limit:,} bytes the manifest recorded")
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            of = f" of {mb(self.total)}" if self.total else ""
            say(f"{self.verb}: {mb(self.done)}{of}")


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] kernel cache: {text}", flush=True)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()
