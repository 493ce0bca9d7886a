"""The behaviour behind the fake node's stub commands (docker, systemctl, systemd-run, nvidia-smi, ip, cloud-init).

State lives under $FAKE_NODE_ROOT/var/lib/fake-node; every call is appended to calls.jsonl there. Faults come from
FAKE_* environment variables (see kimi_cluster/fakes/node/__init__.py), never from anything the product scripts could
know about.
In the sandbox the node's directory ($SANDBOX_NODE_DIR) is the root, FAKE_NODE_DISKS are created on the first
call (the VM image's disks) and FAKE_IP_ADDRS may name $SANDBOX_NODE_HOST, so one environment serves every node.
The stubs run as `python3 -S` (their shebang): they need only the standard library, and skipping site-packages saves
a few milliseconds of each of some 1,400 calls a suite.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# Every stub call is a new interpreter (some 1,400 a suite), so what only some calls need is imported where it is
# used: subprocess (about 8 ms) by the calls that start a process, typing (about 4 ms) by the type checker alone.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

# A test names the root; in the sandbox each node's directory is its root (one value cannot serve many
# nodes, so the engine's per-node variable is the fallback).
ROOT = Path(os.environ.get("FAKE_NODE_ROOT") or os.environ.get("SANDBOX_NODE_DIR") or "/nonexistent-fake-node")
STATE = ROOT / "var/lib/fake-node"
DOCKER = STATE / "docker"
CONTAINERS = DOCKER / "containers"
UNITS = STATE / "units"
DEFAULT_DOCKER_ROOT = "/var/lib/docker"


def record(tool: str, argv: list[str]) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "calls.jsonl", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps({"tool": tool, "argv": argv, "t": time.time()}) + "\n")


def write_json_atomic(path: Path, data: dict) -> None:
    """Readers poll these files while the monitor rewrites them: never let one see half a file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@contextmanager
def locked_json(path: Path, default: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.exists() else json.loads(json.dumps(default))
        yield data
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)


def counter(name: str) -> int:
    """Increments and returns a named counter (how many times something was asked)."""
    with locked_json(STATE / "counters.json", {}) as c:
        c[name] = c.get(name, 0) + 1
        return c[name]


def boot() -> None:
    """What the VM image provides before any command runs: the disks in FAKE_NODE_DISKS exist (e.g. "ephemeral")."""
    for disk in filter(None, (d.strip().strip("/") for d in os.environ.get("FAKE_NODE_DISKS", "").split(","))):
        (ROOT / disk).mkdir(parents=True, exist_ok=True)


def fail(msg: str, code: int = 1) -> NoReturn:
    print(msg, file=sys.stderr)
    sys.exit(code)


# ---- docker ------------------------------------------------------------------------------------------------------

DOCKER_DEFAULT = {"running": True, "root": DEFAULT_DOCKER_ROOT, "images": []}
RUN_VALUE_OPTS = {"--name", "--restart", "--label", "-l", "--gpus", "-p", "--publish", "--network", "--shm-size",
                  "--ulimit", "--log-opt", "-v", "--volume", "--env-file", "-e", "--env", "--entrypoint", "--ipc",
                  "--user", "-u", "-w", "--workdir", "--hostname", "--cpus", "--memory"}


def docker_state() -> dict:
    p = DOCKER / "state.json"
    return json.loads(p.read_text()) if p.exists() else dict(DOCKER_DEFAULT)


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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


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
                    _kill_group(c["hook_pid"])
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


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        pass


# ---- systemd -----------------------------------------------------------------------------------------------------

def unit_file(unit: str) -> Path:
    return UNITS / f"{unit.removesuffix('.service')}.json"


def unit_props(unit: str) -> dict:
    if unit in ("docker", "docker.service", "docker.socket"):
        running = docker_state()["running"]
        return {"ActiveState": "active" if running else "inactive", "Result": "success", "ExecMainStatus": "0",
                "LoadState": "loaded", "SubState": "running" if running else "dead"}
    p = unit_file(unit)
    if not p.exists():
        return {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0", "LoadState": "not-found",
                "SubState": "dead"}
    u = json.loads(p.read_text())
    if u["state"] in ("active", "activating", "deactivating") and u.get("pid") and not alive(u["pid"]) \
            and u.get("monitor") and not alive(u["monitor"]):
        u.update(state="failed", result="signal", status=9)  # the monitor itself was killed
    return {"ActiveState": u["state"], "Result": u.get("result") or "success",
            "ExecMainStatus": str(u.get("status") or 0), "LoadState": "loaded",
            "SubState": "running" if u["state"] == "active" else "dead", "MainPID": str(u.get("pid") or 0)}


def systemctl(argv: list[str]) -> None:
    args = [a for a in argv if a not in ("--quiet", "-q", "--no-pager", "--no-block")]
    if not args:
        fail("fake systemctl: no command")
    cmd, rest = args[0], args[1:]
    if cmd in ("start", "stop", "restart") and all(u in ("docker", "docker.service", "docker.socket") for u in rest):
        with locked_json(DOCKER / "state.json", DOCKER_DEFAULT) as st:
            if cmd == "stop":
                st["running"] = False
            else:
                cfg = ROOT / "etc/docker/daemon.json"
                st["root"] = json.loads(cfg.read_text()).get("data-root", DEFAULT_DOCKER_ROOT) if cfg.exists() \
                    else DEFAULT_DOCKER_ROOT
                st["running"] = True
        return
    if cmd == "is-active":
        state = unit_props(rest[-1])["ActiveState"]
        print(state)
        sys.exit(0 if state == "active" else 3)
    if cmd == "show":
        props, value_only, unit = None, False, None
        i = 0
        while i < len(rest):
            a = rest[i]
            if a in ("-p", "--property"):
                props = rest[i + 1].split(",")
                i += 1
            elif a.startswith("--property="):
                props = a.split("=", 1)[1].split(",")
            elif a == "--value":
                value_only = True
            else:
                unit = a
            i += 1
        values = unit_props(unit or "")
        for p in props or sorted(values):
            print(values.get(p, "") if value_only else f"{p}={values.get(p, '')}")
        return
    if cmd == "stop":
        for unit in rest:
            _stop_unit(unit)
        return
    if cmd == "reset-failed":
        for unit in rest:
            path = unit_file(unit)
            if path.exists() and json.loads(path.read_text())["state"] == "failed":
                path.unlink()
        return
    if cmd == "status":
        for unit in rest:
            print(f"{unit}: {unit_props(unit)}")
        return
    if cmd == "daemon-reload":
        return
    fail(f"fake systemctl: unsupported {argv!r}", 2)


def _stop_unit(unit: str) -> None:
    p = unit_file(unit)
    if not p.exists():
        return
    u = json.loads(p.read_text())
    if u["state"] not in ("active", "activating"):
        return
    u["state"] = "deactivating"
    write_json_atomic(p, u)
    _kill_group(u["pid"])
    deadline = time.time() + 10
    while p.exists() and time.time() < deadline:
        time.sleep(0.05)


def systemd_run(argv: list[str]) -> None:
    unit, props, setenv = None, {}, {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            break
        key, has_eq, inline = a.partition("=")
        if key in ("--unit", "-u", "--description", "--property", "-p", "--setenv", "-E"):
            value = inline if has_eq else argv[i + 1]
            i += 0 if has_eq else 1
            if key in ("--unit", "-u"):
                unit = value
            elif key in ("--property", "-p"):
                k, _, v = value.partition("=")
                props[k] = v
            elif key in ("--setenv", "-E"):
                k, _, v = value.partition("=")
                setenv[k] = v
        elif key in ("--wait", "--pty", "--scope", "--user"):
            fail(f"fake systemd-run: {key} is not emulated", 2)
        i += 1
    command = argv[i:]
    if not unit or not command:
        fail("fake systemd-run: needs --unit and a command", 2)
    p = unit_file(unit)
    if p.exists():
        fail(f"Failed to start transient service unit: Unit {unit}.service was already loaded or has a fragment file.")
    UNITS.mkdir(parents=True, exist_ok=True)
    write_json_atomic(p, {"unit": unit, "state": "activating", "pid": None, "command": command})
    spec = {"unit": unit, "props": props, "setenv": setenv, "command": command}
    import subprocess

    subprocess.Popen([sys.executable, __file__, "--monitor", json.dumps(spec)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env=dict(os.environ))
    deadline = time.time() + 10
    while time.time() < deadline:
        if p.exists() and json.loads(p.read_text()).get("pid"):
            print(f"Running as unit: {unit}.service", file=sys.stderr)
            return
        if not p.exists():
            return
        time.sleep(0.02)
    fail("fake systemd-run: the unit did not start")


def monitor(spec_json: str) -> None:
    """Plays systemd for one transient unit: runs it in its own session and records how it ended."""
    spec = json.loads(spec_json)
    p = unit_file(spec["unit"])
    out_spec = spec["props"].get("StandardOutput", "")
    log_path = (out_spec.split(":", 1)[1] if out_spec.startswith(("append:", "file:"))
                else str(UNITS / f"{spec['unit']}.log"))
    # systemd starts units with a clean environment; PATH, the fake's knobs and the machine's trust store (the
    # sandbox hub's CA, as systemd's DefaultEnvironment would carry it) stand in for the node's defaults.
    env = {k: v for k, v in os.environ.items() if k == "PATH" or k.startswith("FAKE_")
           or k in ("LANG", "TMPDIR", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")}
    env.update(spec["setenv"])
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    import subprocess

    # Restart=always (the caretaker's unit): a child that ends, killed or not, is started again after RestartSec,
    # unless `systemctl stop` ended it (the unit is then "deactivating").
    always = spec["props"].get("Restart") == "always"
    restart_s = float(spec["props"].get("RestartSec", "0.1").removesuffix("s"))
    starts = 0
    while True:
        with open(log_path, "a") as log:
            child = subprocess.Popen(spec["command"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd="/")
            starts += 1
            write_json_atomic(p, {"unit": spec["unit"], "state": "active", "pid": child.pid, "monitor": os.getpid(),
                                  "command": spec["command"], "starts": starts})
            rc = child.wait()
        if not always or not p.exists() or json.loads(p.read_text())["state"] == "deactivating":
            break
        time.sleep(restart_s)
        if json.loads(p.read_text())["state"] == "deactivating":
            break
    u = json.loads(p.read_text())
    if u["state"] == "deactivating" or rc == 0:
        p.unlink()  # a transient unit that stopped cleanly is unloaded, as systemd does
    else:
        u.update(state="failed", result="exit-code" if rc > 0 else "signal", status=abs(rc))
        write_json_atomic(p, u)


# ---- the rest ----------------------------------------------------------------------------------------------------

def nvidia_smi(argv: list[str]) -> None:
    n = int(os.environ.get("FAKE_GPU_COUNT", "8"))
    if n <= 0:
        fail("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9)
    name = os.environ.get("FAKE_GPU_NAME", "NVIDIA H100 80GB HBM3")
    for i in range(n):
        print(f"{i}, {name}, 81559 MiB")


def ip(argv: list[str]) -> None:
    if [a for a in argv if a not in ("-o", "-4")][:2] not in (["addr", "show"], ["address", "show"], ["a", "show"]):
        fail(f"fake ip: unsupported {argv!r}", 2)
    spec = ip_addrs()
    for idx, item in enumerate(spec.split(","), start=1):
        nic, _, cidr = item.partition("=")
        print(f"{idx}: {nic}    inet {cidr} scope global {nic}\\       valid_lft forever preferred_lft forever")


def ip_addrs() -> str:
    """`nic=addr/len,...`; $VARS expand, so one value can give each sandbox node its own ($SANDBOX_NODE_HOST)."""
    return os.path.expandvars(os.environ.get("FAKE_IP_ADDRS", "lo=127.0.0.1/8,ens6=10.0.0.5/24"))


def cloud_init(argv: list[str]) -> None:
    if argv[:1] != ["status"]:
        fail(f"fake cloud-init: unsupported {argv!r}", 2)
    n = counter("cloud-init-status")
    if n <= int(os.environ.get("FAKE_CLOUD_INIT_RUNNING_POLLS", "0")):
        print("status: running")
        return
    status = os.environ.get("FAKE_CLOUD_INIT", "done")
    print(f"status: {status}")
    sys.exit({"done": 0, "error": 1, "degraded": 2}.get(status, 0))


def journalctl(argv: list[str]) -> None:
    unit = next((argv[i + 1] for i, a in enumerate(argv) if a in ("-u", "--unit")), None)
    log = UNITS / f"{unit}.log" if unit else None
    if log and log.exists():
        sys.stdout.write(log.read_text())


TOOLS = {"docker": docker, "systemctl": systemctl, "systemd-run": systemd_run, "nvidia-smi": nvidia_smi, "ip": ip,
         "cloud-init": cloud_init, "journalctl": journalctl}


def hangs(tool: str, argv: list[str]) -> bool:
    """FAKE_HANG="nvidia-smi" or "docker info": that call never returns, as a wedged driver or daemon does."""
    for spec in filter(None, (s.strip() for s in os.environ.get("FAKE_HANG", "").split(","))):
        words = spec.split()
        if words[0] == tool and argv[:len(words) - 1] == words[1:]:
            return True
    return False


def main(tool: str) -> None:
    boot()
    record(tool, sys.argv[1:])
    if hangs(tool, sys.argv[1:]):
        while True:
            time.sleep(3600)
    TOOLS[tool](sys.argv[1:])


if __name__ == "__main__" and sys.argv[1:2] == ["--monitor"]:
    monitor(sys.argv[2])
