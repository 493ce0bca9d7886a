"""Sandbox engine test program: a component with depends_on, secrets, config, local and remote commands."""

import os

import pulumi
import pulumi_command
import toyprov
from pulumi_command import local, remote

cfg = pulumi.Config()
toy_dir = cfg.require("toyDir")


class Group(pulumi.ComponentResource):
    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("toy:index:Group", name, None, opts)
        self.first = toyprov.File(f"{name}-first", toy_dir, cfg.get("firstContent") or "one", delay=0.4,
                                  opts=pulumi.ResourceOptions(parent=self))
        # depends_on only: no data flows from first to second, so only the engine's ordering keeps them in turn.
        self.second = toyprov.File(f"{name}-second", toy_dir, "two", file_name=cfg.get("secondName"),
                                   opts=pulumi.ResourceOptions(parent=self, depends_on=[self.first]))
        self.register_outputs({"first_path": self.first.path})


group = Group("grp")
token = toyprov.Token("token", toy_dir)
probe = toyprov.ConfigProbe("probe", toy_dir)
# A read of an existing resource (the `id` option): the provider's read runs, nothing is created or stored.
seen = toyprov.File("seen", toy_dir, "unused", opts=pulumi.ResourceOptions(id="token-file-that-exists-elsewhere"))
if cfg.get_bool("withExtra") is not False:
    toyprov.File("extra", toy_dir, "extra")

# An explicit provider instance: registered as a pulumi:providers:command resource the local command refers to.
command_provider = pulumi_command.Provider("cmd")
hello = local.Command(
    "hello",
    create="echo hello-$WHO",
    environment={"WHO": cfg.require("who")},
    delete=f"echo bye > {toy_dir}/local-deleted",
    opts=pulumi.ResourceOptions(provider=command_provider),
)

nodes = []
for host in ("n0", "n1"):
    nodes.append(remote.Command(
        f"{host}-work",
        connection=remote.ConnectionArgs(host=host, user="ubuntu"),
        create=(
            "date +%s.%N > start; sleep 1; date +%s.%N > end; "
            "cat > stdin.txt; echo home=$HOME; echo pwd=$(pwd); nvidia-smi; echo flag=$NODE_FLAG"
        ),
        delete="rm -f start end stdin.txt; echo deleted >> deletions",
        stdin=cfg.require_secret("apiKey"),
        triggers=[cfg.get("trigger") or "t0"],
    ))

pulumi.export("hello", hello.stdout)
pulumi.export("token", token.token)
pulumi.export("api_key", cfg.require_secret("apiKey"))
pulumi.export("second_path", group.second.path)
pulumi.export("greeting", probe.greeting)
pulumi.export("probe_sdk_greeting", probe.sdk_greeting)
pulumi.export("probe_env_config", probe.env_config)
pulumi.export("probe_project", probe.project)
pulumi.export("node_out", nodes[0].stdout)
pulumi.export("program_pid", os.getpid())
pulumi.export("seen_id", seen.id)
