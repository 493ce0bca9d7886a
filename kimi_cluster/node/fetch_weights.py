#!/usr/bin/env python3
"""Runs on every node: fetch one pinned checkpoint into the Hugging Face cache, each file from the hub once per cluster.

With peers, the files are split between the nodes by size (kimi_cluster/node/weights.py, the same split on every node);
each node downloads its share from the hub and serves its finished, verified files to the others over the private
network, while it fetches every other file from its owner as soon as that file is complete there. A peer that stops
answering or stops making progress loses its share to the survivors, who take it from the hub. Alone, a node
downloads every file from the hub.

Every file is hashed while it is written (sha256 for LFS files, the git blob id for small ones) and compared with
the hub's manifest; a mismatch deletes the file and fetches it again from the hub, once, then fails naming it.
Verified files are recorded (size, hash, mtime), so a re-run keeps them without reading them again, and the check
step compares the record with the manifest instead of reading 1.56 TB a second time.

Transport: huggingface_hub for the manifest, the file URLs and the auth headers; httpx2 (the HTTP client
huggingface_hub itself uses, so nothing new is installed on the node) for the streams; Python's http.server for the
peers. The peer token is read from a root-only file and never leaves the node: each peer request carries an HMAC of
its method, destination (host:port), path, time and a fresh nonce under the token (`peer_authorization`), which the
server checks against its own address, refusing a stale time or a nonce it has seen. So whatever answers on a
peer's address (a process that took the port first, a sniffer on the private network) learns no token, and cannot
replay what it saw, at that peer or any other.

The engine may run beside the peer server (a model-revision change, a replica feeding its re-created twin), as root
in its container, with the cache mounted read-only but possibly swapped by an older launch: the server serves a
blob only if it is still the regular file, of the manifest's size, that was committed (same device and inode), and
opens it without following a link, so a blob turned into a link to a host secret is refused, not sent.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import quote

import httpx2
from huggingface_hub.utils import build_hf_headers

from kimi_cluster.node.weights import (
    DOWNLOAD_WORKERS,
    HUB_FLOOR_SHARE,
    HUB_MIN_RATE,
    HUB_WINDOW_S,
    is_shard,
    owners,
)
from kimi_cluster.node.weights_files import (
    HUB_ATTEMPTS,
    Cache,
    Corrupt,
    Counters,
    Entry,
    Fatal,
    PeerFault,
    hub_manifest,
    log,
    read_secret,
    stream_to,
    write_json,
)
from kimi_cluster.node.weights_peers import (
    PEER_EXTRA_CONNECTIONS,
    PEER_STATUS_DEADLINE_S,
    PEER_STATUS_MAX_BYTES,
    Peer,
    Server,
    parse_status,
    peer_authorization,
    peer_url,
)
from kimi_cluster.node.weights_ranges import HubStreams
from kimi_cluster.node.weights_transfer import Abandoned


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--revision", required=True, help="the pinned 40-hex commit")
    ap.add_argument("--cache-dir", required=True, help="the hub cache, e.g. /ephemeral/hf/hub")
    ap.add_argument("--record", required=True, help="JSON record of the verified files of this revision")
    ap.add_argument("--progress-file", required=True, help="JSON progress, rewritten every --poll-seconds")
    ap.add_argument("--result-file", help="gets 'ok <revision>' or 'failed <revision> <reason>'")
    ap.add_argument("--token-file", help="file holding the hub token (anonymous if missing or empty)")
    ap.add_argument("--endpoint", default=os.environ.get("HF_ENDPOINT") or None, help="hub endpoint")
    ap.add_argument("--workers", type=int, default=DOWNLOAD_WORKERS,
                    help="parallel hub downloads (as many again from peers)")
    ap.add_argument("--rank", type=int, default=0, help="this node's index in --peers")
    ap.add_argument("--peers", default="", help="every node's private address in rank order, host[:port],...")
    ap.add_argument("--peer-token-file", help="root-only file with the cluster's peer token (needed with peers)")
    ap.add_argument("--peer-timeout", type=float, default=300.0,
                    help="seconds a peer may stay unreachable (also at start-up) before its share goes to the hub")
    ap.add_argument("--stall-seconds", type=float, default=180.0,
                    help="seconds without progress after which a peer or a stream counts as stalled")
    ap.add_argument("--peer-min-rate", type=float, default=8e6,
                    help="bytes/s below which a whole transfer from a peer is cut off (its deadline is the file's "
                         "size at this rate, plus --stall-seconds); the file then comes from the hub")
    ap.add_argument("--hub-min-rate", type=float, default=HUB_MIN_RATE,
                    help="bytes/s: a hub stream's floor is never below this (see --hub-floor-share)")
    ap.add_argument("--hub-floor-share", type=float, default=HUB_FLOOR_SHARE,
                    help="a hub stream below this share of its fastest sibling's rate (or --hub-min-rate) for a "
                         "window is re-opened on a new connection from the byte it reached")
    ap.add_argument("--hub-window", type=float, default=HUB_WINDOW_S,
                    help="seconds: the least time a hub stream's rate is measured over before it is judged (its "
                         "window is 4%% of the time its range has left at its siblings' rate, never less)")
    ap.add_argument("--poll-seconds", type=float, default=1.0, help="peer status and progress file interval")
    ap.add_argument("--report-seconds", type=float, default=30.0, help="progress line interval in the log")
    ap.add_argument("--source-address", help="local address for hub connections (default: the system's choice)")
    ap.add_argument("--serve-complete", action="store_true",
                    help="with peers: a node that already has every file still serves them until each peer has them "
                         "too (replicas: a re-created replica fetches from its twin, not from the hub)")
    return ap.parse_args(argv)



class Node:
    def __init__(self, args: argparse.Namespace, manifest: list[Entry], cache: Cache, hub_token: str | None) -> None:
        self.args = args
        self.manifest = manifest
        self.by_name = {e.name: e for e in manifest}
        self.sizes = [(e.name, e.size) for e in manifest]
        self.cache = cache
        self.counters = Counters()
        self.lock = threading.Lock()
        self.done: set[str] = set()
        self.peers_spec = [p for p in args.peers.split(",") if p] if args.peers else []
        self.n = max(1, len(self.peers_spec))
        self.hub_headers = build_hf_headers(token=hub_token)
        self.hub = HubStreams(args, self.hub_headers, cache, self.counters, self.verified)
        self.peer_client = httpx2.Client(timeout=httpx2.Timeout(5.0, read=args.stall_seconds))
        self.peer_token = read_secret(args.peer_token_file)
        now = time.monotonic()
        self.peers = {r: Peer(r, peer_url(spec), now) for r, spec in enumerate(self.peers_spec) if r != args.rank}
        self.corrupt: dict[str, int] = {}
        self.peer_failures: dict[str, int] = {}
        self.hub_only: set[str] = set()

    def peer_auth(self, p: Peer, path: str) -> dict[str, str]:
        """Headers for one GET of `path` from peer p: signed with the token for p's address, a new nonce each time."""
        if not self.peer_token:
            return {}
        return {"Authorization": peer_authorization(self.peer_token, "GET", p.url.removeprefix("http://"), path)}

    # what peers see
    def done_snapshot(self) -> set[str]:
        with self.lock:
            return set(self.done)

    def bytes_done(self) -> int:
        with self.lock:
            verified = sum(self.by_name[n].size for n in self.done)
        with self.counters.lock:
            return verified + sum(self.counters.inflight.values())

    def status(self) -> dict[str, Any]:
        done = self.done_snapshot()
        return {"rank": self.args.rank, "revision": self.args.revision, "done": sorted(done),
                "complete": len(done) == len(self.manifest), "bytes_done": self.bytes_done()}

    def write_progress(self) -> None:
        done = self.done_snapshot()
        write_json(self.args.progress_file, {
            "bytes_done": self.bytes_done(), "bytes_total": sum(e.size for e in self.manifest),
            "files_done": len(done), "files_total": len(self.manifest), "updated_at": time.time(),
            "hub_bytes": self.counters.hub, "peer_bytes": self.counters.peer, "revision": self.args.revision,
            "metadata_done": all(e.name in done for e in self.manifest if not is_shard(e.name)),
            "hub_reopens": self.hub.rates.reopens, "hash_reread_bytes": self.hub.reread,
        })

    # peers
    def peer_status(self, p: Peer) -> dict[str, Any]:
        """A peer's GET /status, read up to a size cap and checked field by field (PeerFault if out of shape)."""
        deadline = time.monotonic() + PEER_STATUS_DEADLINE_S  # the whole answer, so a trickle cannot hold the loop
        with self.peer_client.stream("GET", f"{p.url}/status", headers=self.peer_auth(p, "/status"),
                                     timeout=2.0) as r:
            r.raise_for_status()
            body = b""
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > PEER_STATUS_MAX_BYTES:
                    raise PeerFault(f"its /status answer is over {PEER_STATUS_MAX_BYTES:,} bytes")
                if time.monotonic() > deadline:
                    raise PeerFault(f"its /status answer took over {PEER_STATUS_DEADLINE_S:g} s")
        return parse_status(body, self.args.revision, self.by_name)

    def poll_peers(self) -> None:
        now = time.monotonic()
        own = self.owner_map()
        for p in self.peers.values():
            if p.dead:
                continue  # given up on: its files come from the hub, and what it says no longer counts
            try:
                st = self.peer_status(p)
            except PeerFault as exc:
                p.reachable = False
                self.declare_dead(p, f"answered out of shape ({exc})")
                continue
            except (httpx2.HTTPError, ValueError) as exc:
                p.reachable = False
                p.why = f"{type(exc).__name__}: {exc}"[:200]
                since = p.last_ok if p.last_ok is not None else p.first_try
                if not p.dead and not p.complete and now - since > self.args.peer_timeout:
                    self.declare_dead(p, f"unreachable for {self.args.peer_timeout:.0f} s ({p.why})")
                continue
            p.reachable, p.last_ok = True, now
            p.done = set(st["done"])
            p.complete = p.complete or st["complete"]
            if st["bytes_done"] != p.bytes_done:
                p.bytes_done, p.progress_at = st["bytes_done"], now
            elif (not p.dead and now - p.progress_at > self.args.stall_seconds
                  and any(r == p.rank and f not in p.done for f, r in own.items())):
                # Only a peer with files of its own still to fetch can stall: one that waits for others cannot.
                self.declare_dead(p, f"no progress for {self.args.stall_seconds:.0f} s")

    def declare_dead(self, p: Peer, why: str) -> None:
        p.dead = True
        log(f"peer {p.rank} ({p.url}) {why}: its files go to the other nodes, which take them from the hub")

    def owner_map(self) -> dict[str, int]:
        return owners(self.sizes, self.n, {p.rank for p in self.peers.values() if p.dead})

    # one file
    def fetch(self, e: Entry, source: Peer) -> None:
        """One file from a peer, whole, in one stream."""
        tmp = self.cache.blob(e) + ".incomplete"
        try:
            path = f"/files/{quote(e.name)}"
            url = source.url + path
            # The whole transfer has a deadline: a peer's own byte count cannot vouch for its speed.
            deadline = time.monotonic() + e.size / self.args.peer_min_rate + self.args.stall_seconds
            stream_to(self.peer_client, url, {}, e, tmp, self.counters, False, 2, deadline,
                      sign=lambda: self.peer_auth(source, path))
            self.cache.commit(e, tmp)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        finally:
            self.counters.drop(e.name)
        self.verified(e)

    def verified(self, e: Entry) -> None:
        with self.lock:
            self.done.add(e.name)

    # the whole run
    def run(self) -> None:
        for e in self.manifest:
            if self.cache.is_verified(e):
                self.done.add(e.name)
        kept = len(self.done)
        if kept:
            log(f"kept {kept} of {len(self.manifest)} files verified on an earlier run")
        total = sum(e.size for e in self.manifest)
        log(f"{len(self.manifest)} files, {total / 1e9:,.2f} GB; node {self.args.rank} of {self.n}"
            + (f", sharing with {len(self.peers)} peers" if self.peers else ", every file from the hub"))
        server = None
        if self.peers and (len(self.done) < len(self.manifest) or self.args.serve_complete):
            if not self.peer_token:
                raise Fatal("peers given but no peer token (--peer-token-file)")
            bind = self.peers_spec[self.args.rank].rpartition(":")[0] or self.peers_spec[self.args.rank]
            bind_port = int(peer_url(self.peers_spec[self.args.rank]).rsplit(":", 1)[1])
            cap = len(self.peers) * (self.args.workers + 2) + PEER_EXTRA_CONNECTIONS
            server = Server(bind, bind_port, self.peer_token, self, max_connections=cap)
            server.start()
            log(f"serving finished files to the peers on {bind}:{bind_port} (private network only)")
        try:
            self._loop()
        finally:
            if server is not None:
                server.stop()
                log("peer server stopped; nothing is listening any more")
            self.peer_client.close()
            self.write_progress()

    def _loop(self) -> None:
        inflight: dict[Future[None], tuple[Entry, Peer | None]] = {}
        names_inflight: set[str] = set()
        pool = ThreadPoolExecutor(max_workers=self.args.workers)  # from peers; the hub's streams have their own
        ok = False
        try:
            self._schedule(pool, inflight, names_inflight)
            ok = True
        finally:
            # On a failure, do not wait for the other streams: the process exits and the files stay .incomplete.
            pool.shutdown(wait=False, cancel_futures=True)
            self.hub.close(wait=ok)

    def _schedule(self, pool: ThreadPoolExecutor, inflight: dict[Future[None], tuple[Entry, Peer | None]],
                  names_inflight: set[str]) -> None:
        a = self.args
        last_report = 0.0
        recorded_complete = False
        while True:
            self.poll_peers()
            own = self.owner_map()
            hub_n = sum(1 for _, src in inflight.values() if src is None)
            peer_n = len(inflight) - hub_n
            # The metadata first (the kernel warm-up waits for it), then the biggest shards first.
            todo = sorted((e for e in self.manifest if e.name not in self.done and e.name not in names_inflight),
                          key=lambda e: (is_shard(e.name), -e.size, e.name))
            hub_waiting = False  # a whole file this node takes from the hub is waiting for a stream
            for e in todo:
                holders = [p for p in self.peers.values() if p.reachable and not p.dead and e.name in p.done]
                holders.sort(key=lambda p: (p.rank != own[e.name], p.rank))
                if holders and e.name not in self.hub_only:
                    if peer_n < a.workers:
                        inflight[pool.submit(self.fetch, e, holders[0])] = (e, holders[0])
                        names_inflight.add(e.name)
                        peer_n += 1
                elif own[e.name] == a.rank or e.name in self.hub_only or self._nobody_else(own[e.name]):
                    if hub_n < a.workers and (e.name in self.hub_only or self._peers_seen()):
                        inflight[self.hub.submit(*self.hub.start(e))] = (e, None)
                        names_inflight.add(e.name)
                        hub_n += 1
                    else:
                        hub_waiting = True
            # The tail: fewer files left than streams, so each free stream takes half the range with most bytes left.
            while not hub_waiting and hub_n < a.workers:
                half = self.hub.split()
                if half is None:
                    break
                inflight[self.hub.submit(*half)] = (half[0].e, None)
                hub_n += 1
            finished, _ = wait(list(inflight), timeout=a.poll_seconds, return_when=FIRST_COMPLETED) \
                if inflight else (set(), None)
            for fut in finished:
                e, src = inflight.pop(fut)
                if src is not None or self.hub.ended(e.name):  # a hub file is in flight until its last range ends
                    names_inflight.discard(e.name)
                if not isinstance(fut.exception(), Abandoned):  # settled by the range that failed
                    self._settle(fut, e, src)
            self.write_progress()
            now = time.monotonic()
            if now - last_report >= a.report_seconds:
                self._report()
                last_report = now
            if len(self.done) == len(self.manifest):
                if not recorded_complete:
                    self.cache.finish(self.manifest)
                    recorded_complete = True
                    self._report()
                    log(f"all {len(self.manifest)} files verified")
                # Keep serving until every peer has everything, was given up on, or went away after it was seen
                # (one that has not answered yet may still be starting: it is waited for up to --peer-timeout).
                if all(p.complete or p.dead or (p.last_ok is not None and not p.reachable)
                       for p in self.peers.values()):
                    if a.serve_complete:
                        # Stay up a few polls more so that a peer serving with --serve-complete sees this node
                        # complete; otherwise it never saw it and waits out --peer-timeout for it.
                        time.sleep(max(5.0, 3 * a.poll_seconds))
                    return
            if not inflight:
                time.sleep(a.poll_seconds)

    def _peers_seen(self) -> bool:
        """With --serve-complete (replicas), nothing comes from the hub until every peer has answered once or was
        given up on: a peer may already hold every file (a re-created replica's twin), and it must get the chance
        to say so before this node downloads its own share again. Bounded by --peer-timeout."""
        return not self.args.serve_complete or all(p.last_ok is not None or p.dead for p in self.peers.values())

    def _nobody_else(self, owner: int) -> bool:
        p = self.peers.get(owner)
        return p is None or p.dead

    def _settle(self, fut: Future[None], e: Entry, src: Peer | None) -> None:
        exc = fut.exception()
        if exc is None:
            return
        where = "the hub" if src is None else f"peer {src.rank}"
        if isinstance(exc, Corrupt):
            self.corrupt[e.name] = self.corrupt.get(e.name, 0) + 1
            if self.corrupt[e.name] > 1:
                raise Fatal(f"{e.name} failed its hash twice (last from {where}): {exc}")
            log(f"CORRUPT from {where}: {exc}; deleted, fetching it again from the hub")
            self.hub_only.add(e.name)
        elif isinstance(exc, Fatal):
            raise exc
        elif src is not None and isinstance(exc, PeerFault):
            self.hub_only.add(e.name)
            if not src.dead:
                self.declare_dead(src, f"was too slow: {exc}")
            src.reachable = False
        elif src is None:
            raise Fatal(f"{e.name}: the hub download failed after {HUB_ATTEMPTS} attempts: {type(exc).__name__}: {exc}")
        else:
            self.peer_failures[e.name] = self.peer_failures.get(e.name, 0) + 1
            if self.peer_failures[e.name] >= 3:
                self.hub_only.add(e.name)
            log(f"{e.name} from peer {src.rank} failed ({type(exc).__name__}: {exc}); trying again"
                + (" from the hub" if e.name in self.hub_only else ""))
            src.reachable = False

    def _report(self) -> None:
        done = self.bytes_done()
        total = sum(e.size for e in self.manifest)
        log(f"weights: {done / 1e9:,.2f} of {total / 1e9:,.2f} GB, {len(self.done)}/{len(self.manifest)} files "
            f"verified; from the hub {self.counters.hub / 1e9:,.2f} GB, from peers {self.counters.peer / 1e9:,.2f} GB"
            + self.hub.summary())


def record_result(path: str | None, line: str) -> None:
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
        os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache = Cache(args.cache_dir, args.repo, args.revision, args.record)
    try:
        recorded = cache.recorded_manifest()
        complete = recorded is not None and all(cache.is_verified(e) for e in recorded)
        if complete and recorded is not None and args.serve_complete and args.peers:
            # The record is this revision's manifest: serve every file to the peers, and ask the hub nothing.
            log(f"all {len(recorded)} files were verified on an earlier run; serving them until every peer has them")
            Node(args, recorded, cache, None).run()
            record_result(args.result_file, f"ok {args.revision}")
            return 0
        if complete and recorded is not None:
            # A finished download of this revision, unchanged since: nothing to ask the hub or the peers.
            log(f"all {len(recorded)} files of {args.repo}@{args.revision} were verified on an earlier run and are "
                "unchanged; nothing to fetch")
            total = sum(e.size for e in recorded)
            write_json(args.progress_file, {"bytes_done": total, "bytes_total": total, "files_done": len(recorded),
                                            "files_total": len(recorded), "updated_at": time.time(),
                                            "hub_bytes": 0, "peer_bytes": 0})
            record_result(args.result_file, f"ok {args.revision}")
            return 0
        token = read_secret(args.token_file)
        log(f"reading the manifest of {args.repo}@{args.revision} from the hub")
        node = Node(args, hub_manifest(args, token), cache, token)
        node.run()
    except Exception as exc:  # noqa: BLE001 - reported by the poller; messages name files and URLs, never a token
        reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:2000]
        log(f"download failed: {reason}")
        record_result(args.result_file, f"failed {args.revision} {reason}")
        sys.stdout.flush()
        os._exit(1)  # without joining streams that are still running: their files stay .incomplete
    record_result(args.result_file, f"ok {args.revision}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
