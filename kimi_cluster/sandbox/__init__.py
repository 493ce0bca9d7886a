"""The local sandbox: the whole kimi-cluster flow on one machine, with no account and no GPU, under the real Pulumi
CLI. `kimi-cluster sandbox up | verify | status | reclaim | destroy` is its door.

- kimi.py: the Sandbox (the stacks' config, up, verify, status, reclaim, destroy);
- services.py: the fakes it starts and keeps (emulator, hub, kernel-cache bucket); leftovers.py: what destroy looks
  for beyond the checkpoint;
- cli_stacks.py and pulumi_cli.py: the two stacks under the real CLI (file backend, passphrase, project folders);
- nodes.py: what the fake nodes look like and the network they sit on (kimi_cluster/fakes/node_fabric.py);
- workdir.py: the working directory and the secrets the sandbox makes;
- reclaim.py: the cloud taking a VM away; printing.py: outputs and the verification's report.
"""
