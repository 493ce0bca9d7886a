"""The fake node's `docker`: a daemon that can be stopped, images pulled, containers run by the engine hook
(kimi_cluster/fakes/node/engine_hook.py), listed, stopped and removed (see _fakenode.py)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from _fakestate import CONTAINERS, DOCKER, DOCKER_DEFAULT, alive, counter, docker_state, fail, kill_group, locked_json

# Every stub call is a new interpreter (some 1,400 a suite), so what only some calls need is imported where it is
# used: subprocess (about 8 ms) by the calls that start a process, typing (about 4 ms) by the type checker alone.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


RUN_VALUE_OPTS = {"--name", "--restart", "--label", "-l", "--gpus", "-p", "--publish", "--network", "--shm-size",
                  "--ulimit", "--log-opt", "-v", "--volume", "--env-file", "-e", "--env", "--entrypoint", "--ipc",
                  "--user", "-u", "-w", "--workdir", "--hostname", "--cpus", "--memory"}


def require_daemon() -> None:
    if not docker_state()["running"]:
        fail("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")


def containers() -> list[dict]:
    if not CONTAINERS.exists():
        return []
    out = []
    for p in sorted(CONTAINERS.glob("*.json")):
        c = json.loads(p.read_text())
        if c.get("hook_pid") and c["status"] == "running" and not alive(c["hook_pid"]):
            c["status"] = "exited"
            # The run hook writes its process's exit code here when it waits for it (a container that ends by
            # itself); otherwise the code of a process nobody waited for is unknown, and docker's 0 stands.
            code = p.with_suffix(".exit")
            if code.exists():
                c["exit_code"] = int(code.read_text().strip() or 0)
        out.append(c)
    return out


def docker(argv: list[str]) -> None:
    if not argv:
        fail("usage: docker COMMAND")
    cmd, args = argv[0], argv[1:]
    if cmd == "info":
        require_daemon()
        root = docker_state()["root"]
        fmt = _opt(args, "--format", "-f")
        print(root if fmt and "DockerRootDir" in fmt else f"Docker Root Dir: {root}")
    elif cmd == "system" and args[:1] == ["prune"]:
        require_daemon()
        print("Total reclaimed space: 0B")
    elif cmd == "pull":
        require_daemon()
        image = args[-1]
        n = counter("pull")
        fails = int(os.environ.get("FAKE_PULL_FAILS", "0"))
        if fails < 0 or n <= fails:
            print(f"{image}: Pulling from library", flush=True)
            fail("Error response from daemon: Get \"https://registry/v2/\": net/http: TLS handshake timeout "
                 f"(fake, attempt {n})")
        delay = float(os.environ.get("FAKE_PULL_SECONDS", "0"))
        print(f"{image}: Pulling from library\nabc123: Pull complete", flush=True)
        time.sleep(delay)
        with locked_json(DOCKER / "state.json", DOCKER_DEFAULT) as st:
            if image not in st["images"]:
                st["images"].append(image)
        print(f"Status: Downloaded newer image for {image}")
    elif cmd == "image" and args[:1] == ["inspect"]:
        require_daemon()
        if args[-1] in docker_state()["images"]:
            print(json.dumps([{"RepoTags": [args[-1]]}]))
        else:
            fail(f"Error response from daemon: No such image: {args[-1]}")
    elif cmd == "rm":
        require_daemon()
        for name in [a for a in args if not a.startswith("-")]:
            p = CONTAINERS / f"{name}.json"
            if p.exists():
                c = json.loads(p.read_text())
                if c.get("hook_pid"):
                    kill_group(c["hook_pid"])
                p.unlink()
                p.with_suffix(".exit").unlink(missing_ok=True)
                print(name)
            elif "-f" not in args and "--force" not in args:
                fail(f"Error response from daemon: No such container: {name}")
    elif cmd == "ps":
        require_daemon()
        _docker_ps(args)
    elif cmd == "logs":
        require_daemon()
        name = args[-1]
        log = CONTAINERS / f"{name}.log"
        if not (CONTAINERS / f"{name}.json").exists():
            fail(f"Error response from daemon: No such container: {name}")
        lines = log.read_text().splitlines() if log.exists() else []
        tail = _opt(args, "--tail", "-n")
        if tail and tail != "all":
            lines = lines[-int(tail):] if int(tail) else []
        for line in lines:
            print(line)
    elif cmd == "inspect":
        require_daemon()
        name = args[-1]
        c = next((c for c in containers() if c["name"] == name), None)
        if c is None:
            fail(f"Error: No such object: {name}")
        fmt = _opt(args, "--format", "-f")
        if fmt is not None:
            # The one Go template the node scripts ask for.
            if fmt != "{{.State.ExitCode}}":
                fail(f"fake docker inspect: unsupported --format {fmt!r}", 2)
            print(c.get("exit_code", 0))
            return
        # As docker reports it; a test can set "restart_count" and status "restarting" to play a crash loop.
        print(json.dumps([{"Name": "/" + name, "RestartCount": c.get("restart_count", 0),
                           "State": {"Status": c["status"], "Running": c["status"] == "running",
                                     "Restarting": c["status"] == "restarting", "StartedAt": c.get("started_at"),
                                     "ExitCode": c.get("exit_code", 0)},
                           "Config": {"Labels": c["labels"], "Image": c["image"]}, "Args": c["args"]}]))
    elif cmd == "run":
        require_daemon()
        _docker_run(args)
    elif cmd == "exec":
        require_daemon()
        name, command = args[0], args[1:]
        p = CONTAINERS / f"{name}.json"
        if not p.exists() or json.loads(p.read_text())["status"] != "running":
            fail(f"Error response from daemon: container {name} is not running")
        if not os.environ.get("FAKE_DOCKER_RUN_HOOK"):
            fail("fake docker exec: needs FAKE_DOCKER_RUN_HOOK", 126)
        c = json.loads(p.read_text())
        import subprocess

        done = subprocess.run([os.environ["FAKE_DOCKER_RUN_HOOK"], "--exec", *c["argv"][2:], "--", *command])
        sys.exit(done.returncode)
    else:
        fail(f"fake docker: unsupported command {argv!r}", 2)


def _opt(args: list[str], *names: str) -> str | None:
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def _docker_ps(args: list[str]) -> None:
    filters, fmt, quiet, show_all = [], None, False, False
    # docker takes combined short flags (`-aq`) as its CLI library does.
    args = [w for a in args for w in ([f"-{c}" for c in a[1:]] if re.fullmatch(r"-[aq]{2,}", a) else [a])]
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-q", "--quiet"):
            quiet = True
        elif a in ("-a", "--all"):
            show_all = True
        elif a in ("--filter", "-f"):
            filters.append(args[i + 1])
            i += 1
        elif a == "--format":
            fmt = args[i + 1]
            i += 1
        i += 1
    for c in containers():
        if not show_all and c["status"] != "running":
            continue
        ok = True
        for f in filters:
            key, _, value = f.partition("=")
            if key == "name":
                ok &= re.search(value, c["name"]) is not None
            elif key == "label":
                k, _, v = value.partition("=")
                ok &= c["labels"].get(k) == v if v else k in c["labels"]
            elif key == "status":
                ok &= c["status"] == value
        if not ok:
            continue
        status = "Up 3 seconds" if c["status"] == "running" else f"Exited ({c.get('exit_code', 0)}) 2 seconds ago"
        if quiet:
            print(c["id"])
        elif fmt:
            print(fmt.replace("{{.Status}}", status).replace("{{.Names}}", c["name"]).replace("{{.ID}}", c["id"]))
        else:
            print(f"{c['id']}  {c['image']}  {status}  {c['name']}")


def _docker_run(args: list[str]) -> None:
    name, env_file, labels, env, image_at = None, None, {}, [], None
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            image_at = i
            break
        key, has_eq, inline = a.partition("=")
        if key in RUN_VALUE_OPTS:
            value = inline if has_eq else args[i + 1]
            i += 0 if has_eq else 1
            if key == "--name":
                name = value
            elif key == "--env-file":
                env_file = value
            elif key in ("--label", "-l"):
                k, _, v = value.partition("=")
                labels[k] = v
            elif key in ("-e", "--env"):
                env.append(value)
        i += 1
    if image_at is None:
        fail('"docker run" requires at least 1 argument.', 125)
    name = name or f"fake_{counter('run')}"
    if (CONTAINERS / f"{name}.json").exists():
        fail(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use.', 125)
    if env_file and not os.access(env_file, os.R_OK):
        fail(f"docker: open {env_file}: no such file or directory.", 125)
    CONTAINERS.mkdir(parents=True, exist_ok=True)
    cid = f"{counter('container-id'):012x}"
    log = CONTAINERS / f"{name}.log"
    crash = os.environ.get("FAKE_RUN_EXITS") == "1"
    c: dict[str, Any] = {"id": cid, "name": name, "image": args[image_at], "args": args[image_at + 1:],
         "argv": ["docker", "run", *args], "env_file": env_file, "env": env, "labels": labels,
         "status": "exited" if crash else "running", "hook_pid": None, **({"exit_code": 1} if crash else {}),
         "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(log, "w") as fh:
        if crash:
            fh.write(f"fake engine: error: unrecognized arguments (API key seen: {_env_file_secret(env_file)})\n")
            fh.write(os.environ.get("FAKE_RUN_LOG", ""))  # more of the dying engine's log, as a test chooses it
        elif os.environ.get("FAKE_DOCKER_RUN_HOOK"):
            import subprocess

            hook = subprocess.Popen([os.environ["FAKE_DOCKER_RUN_HOOK"], *args], stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            c["hook_pid"] = hook.pid
        else:
            fh.write(f"fake engine {name} started with {len(c['args'])} arguments\n")
    (CONTAINERS / f"{name}.json").write_text(json.dumps(c, indent=1))
    print(cid)


def _env_file_secret(path: str | None) -> str:
    """What a chatty engine would print at start-up: the values it was given, secrets included."""
    if not path or not os.path.exists(path):
        return "none"
    return ",".join(line.split("=", 1)[1] for line in Path(path).read_text().splitlines() if "=" in line)

