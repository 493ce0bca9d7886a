"""A local S3-compatible bucket for the kernel cache: moto's server mode (https://docs.getmoto.org/en/latest/docs/
server_mode.html), a real implementation of the S3 API, with request signing enforced.

It makes one IAM user with an access key allowed `s3:*`, and one bucket; from then on moto checks every request's
signature, so a wrong secret gets S3's own `SignatureDoesNotMatch` and an unknown key `InvalidAccessKeyId`. The key
pair is written to a 0600 file as ACCESS_KEY_ID:SECRET (the form of kimi-cluster:kernelCacheCredentials), never
printed. moto keeps objects in memory; with --data-dir the bucket's objects are loaded from that folder at start
and written back to it on SIGTERM, so the bucket outlives the process as a real one outlives the cluster.

    python -m kimi_cluster.fakes.s3_store --port 8124 --bucket kimi-sandbox-kernels --credentials-file creds.txt
    [--data-dir D]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import threading
from dataclasses import dataclass
from typing import Any

# Requests allowed before signing is enforced: create the user, its key, its policy, the bucket.
BOOTSTRAP_ACTIONS = 4
_ALLOW_S3 = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}'
REGION = "us-east-1"


@dataclass
class S3Store:
    """A running store: `url` is the endpointUrl, `credentials` the ID:SECRET pair that it accepts."""

    url: str
    bucket: str
    credentials: str
    server: Any

    def client(self, credentials: str | None = None) -> Any:
        import boto3

        key_id, _, secret = (credentials or self.credentials).partition(":")
        return boto3.client("s3", endpoint_url=self.url, region_name=REGION, aws_access_key_id=key_id,
                            aws_secret_access_key=secret)

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> S3Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start(bucket: str, host: str = "127.0.0.1", port: int = 0) -> S3Store:
    """Start moto's server on a thread of this process and bootstrap the user, key and bucket."""
    # moto reads this when it is first imported; a process that imported moto already keeps its own setting.
    os.environ.setdefault("INITIAL_NO_AUTH_ACTION_COUNT", str(BOOTSTRAP_ACTIONS))
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    real_host, real_port = server.get_host_and_port()
    url = f"http://{real_host}:{real_port}"
    boot = {"endpoint_url": url, "region_name": REGION, "aws_access_key_id": "bootstrap",
            "aws_secret_access_key": "bootstrap"}
    iam = boto3.client("iam", **boot)
    iam.create_user(UserName="kimi-cluster")
    key = iam.create_access_key(UserName="kimi-cluster")["AccessKey"]
    iam.put_user_policy(UserName="kimi-cluster", PolicyName="kernel-cache", PolicyDocument=_ALLOW_S3)
    boto3.client("s3", **boot).create_bucket(Bucket=bucket)
    return S3Store(url, bucket, f"{key['AccessKeyId']}:{key['SecretAccessKey']}", server)


def load(store: S3Store, data_dir: str) -> int:
    """Put every file under data_dir into the bucket, under its relative path."""
    s3, count = store.client(), 0
    for dirpath, _, names in os.walk(data_dir):
        for name in names:
            if name.endswith(".tmp"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, "rb") as fh:
                s3.put_object(Bucket=store.bucket, Key=os.path.relpath(path, data_dir).replace(os.sep, "/"),
                              Body=fh.read())
            count += 1
    return count


def dump(store: S3Store, data_dir: str) -> int:
    """Write every object of the bucket to data_dir (replacing what was there), one file per key."""
    s3, keys = store.client(), []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=store.bucket):
        keys += [o["Key"] for o in page.get("Contents", [])]
    tmp = data_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for key in keys:
        if key.startswith("/") or ".." in key.split("/"):
            continue
        path = os.path.join(tmp, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(s3.get_object(Bucket=store.bucket, Key=key)["Body"].read())
    os.makedirs(tmp, exist_ok=True)
    shutil.rmtree(data_dir, ignore_errors=True)
    os.replace(tmp, data_dir)
    return len(keys)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Serve one S3 bucket on loopback (moto), signatures enforced.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--credentials-file", required=True, help="where to write ACCESS_KEY_ID:SECRET (mode 0600)")
    ap.add_argument("--data-dir", help="load the bucket's objects from here at start, write them back on SIGTERM")
    args = ap.parse_args(argv)
    store = start(args.bucket, args.host, args.port)
    if args.data_dir:
        os.makedirs(args.data_dir, exist_ok=True)
        print(f"loaded {load(store, args.data_dir)} objects from {args.data_dir}", flush=True)
    fd = os.open(args.credentials_file + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(store.credentials + "\n")
    os.replace(args.credentials_file + ".tmp", args.credentials_file)
    print(f"S3 store (moto) serving bucket {args.bucket} at {store.url}; credentials in {args.credentials_file}",
          flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    if args.data_dir:
        print(f"kept {dump(store, args.data_dir)} objects in {args.data_dir}", flush=True)
    store.stop()


if __name__ == "__main__":
    main()
