#!/usr/bin/env bash
# What the sandbox's fake nodes need on this machine (kimi_cluster/fakes/node_fabric.py): iproute2 for the network namespaces,
# Debian's OpenSSH server in each of them, nftables for their security rules. Installed with apt-get when missing
# and run as root; the packages' own sshd service is never started (policy-rc.d says no while they install).
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v nft >/dev/null 2>&1 || need+=(nftables)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "node-fabric-deps: missing ${need[*]}: install them (as root: apt-get install ${need[*]})" >&2
    exit 1
fi
echo "node-fabric-deps: installing ${need[*]}" >&2
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
trap '[ -z "$made_policy" ] || rm -f "$policy"' EXIT
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
