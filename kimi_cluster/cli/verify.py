"""Command-line verifier of a deployed Kimi K3.1 Pro endpoint: one PASS/FAIL line per check, exit 0 only
if all passed. The key comes from KIMI_API_KEY or --api-key-file (argv shows in `ps`) and is never printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence

from kimi_cluster.checks import (
    API_KEY_ENV,
    CHECK_NAMES,
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT_S,
    CheckResult,
    redact,
    redact_obj,
    verify,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# --timeout: a check's budget in seconds; an infinite or NaN one reaches threading's wait and the sockets as a crash,
# and a day is longer than any check needs.
MAX_TIMEOUT_S = 86400.0
KEY_FILE_MAX = 64 * 1024  # an API key is a line; a file past this is not a key file
CA_FILE_MAX = 1024 * 1024  # a PEM bundle of CA certificates is a few KB


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kimi-cluster verify",
        description="Check a Kimi K3.1 Pro endpoint (SGLang or vLLM) the way the guide tests it by hand.",
    )
    parser.add_argument("--base-url", required=True,
                        help="endpoint root, e.g. http://1.2.3.4:8000 (a trailing /v1 is accepted)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"served model id (default {DEFAULT_MODEL})")
    parser.add_argument("--api-key-file", help="file holding the key; '-' reads it from standard input")
    parser.add_argument("--api-key-env", default=API_KEY_ENV,
                        help=f"environment variable holding the key (default {API_KEY_ENV})")
    parser.add_argument("--api-key", help="the key itself; visible in ps, prefer the env var or a file")
    parser.add_argument("--ca-file", help="PEM of the CA the endpoint's certificate must chain to (the cluster's "
                        "ca_certificate output); default: this machine's trusted CAs")
    parser.add_argument("--only", help="comma list of checks to run: " + ",".join(CHECK_NAMES))
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds allowed for each check in total (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    return parser


def _resolve_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file:
        if args.api_key_file == "-":
            key = sys.stdin.readline(KEY_FILE_MAX + 1)
        else:
            with open(args.api_key_file, encoding="utf-8") as handle:
                key = handle.read(KEY_FILE_MAX + 1)
        if len(key) > KEY_FILE_MAX:  # /dev/zero, a log given by mistake: never read to the end
            raise ValueError(f"--api-key-file {args.api_key_file} is longer than {KEY_FILE_MAX:,} characters; it "
                             "must hold only the key (its content is not shown)")
        key = key.strip()
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file} holds no key")
        if len(key.splitlines()) > 1:  # a key file with a second line (a comment, a second key): shown nowhere
            raise ValueError(f"--api-key-file {args.api_key_file} holds {len(key.splitlines())} lines; it must hold "
                             "only the key (its content is not shown)")
        return key
    if args.api_key:
        print("warning: --api-key is visible to other users in ps; prefer "
              f"{args.api_key_env} or --api-key-file", file=sys.stderr)
        return args.api_key
    return os.environ.get(args.api_key_env) or None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT_S):
        print(f"error: --timeout {args.timeout:g} is not a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        key = _resolve_key(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not key:
        print(f"warning: no API key ({args.api_key_env} unset, no --api-key-file); "
              "authenticated checks will fail", file=sys.stderr)

    def show(result: CheckResult) -> None:
        if not args.json:
            print(redact(result.line(), key), flush=True)

    try:
        ca = None
        if args.ca_file:
            with open(args.ca_file, encoding="utf-8") as handle:
                ca = handle.read(CA_FILE_MAX + 1)
            if len(ca) > CA_FILE_MAX:
                raise ValueError(f"--ca-file {args.ca_file} is larger than {CA_FILE_MAX // 1024} KB, more than any "
                                 "PEM of CA certificates")
        outcome = verify(args.base_url, args.model, key, only=args.only, timeout=args.timeout, on_result=show,
                         ca_certificate=ca)
    except OSError as exc:
        print(f"error: --ca-file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    if args.json:
        document = {
            "base_url": outcome.endpoint_url,
            "model": outcome.model,
            "verified": outcome.all_passed,
            "checks": outcome.report(),
        }
        print(json.dumps(redact_obj(document, key), indent=2))
    else:
        failed = [r.name for r in outcome.failed]
        summary = "all checks passed" if not failed else f"{len(failed)} failed: {', '.join(failed)}"
        print(f"{len(outcome.results)} checks against {outcome.endpoint_url} ({outcome.model}): {summary}")
    return EXIT_OK if outcome.all_passed else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
