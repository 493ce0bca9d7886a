"""The stack's configuration: every key under `kimi-cluster:`, validated into one model before anything bills.

This package holds the model and its rules; it re-exports the names callers use. Turning raw config (a stack file,
Pulumi's config) into Settings is kimi_cluster.settings.loader's, imported from there: it alone reaches beyond the
package (to kimi_cluster/plan/launch.py, whose command line decides which engine flags are the program's own).

  keys.py          the namespace and the secret keys
  errors.py        SettingsError, how a value is shown and a key is set, the bounded error message
  rules.py         each key's own rules (patterns, durations, URLs, CIDRs, paths)
  ports.py         the port map: the ports the program uses on the nodes, which no key may take
  networks.py      what kind of network an address is (public, private, loopback), the CIDR widths accepted
  cross_rules.py   the rules across keys
  ssh_key.py       the SSH public and private key rules
  node_timing.py   kimi-cluster:nodeTiming, the node scripts' waits (kimi_cluster/settings/timing.py)
  kernel_cache_store.py  kimi-cluster:kernelCache, the bucket the compiled kernels are kept in
  model.py         Settings: the fields, their validators and every derived value
  loader.py        stack files and Pulumi config -> Settings, or one SettingsError
"""

from __future__ import annotations

from kimi_cluster.settings.errors import ERROR_MAX_LINE, ERROR_MAX_LINES, EXAMPLES, SettingsError, how_to_set, shown
from kimi_cluster.settings.kernel_cache_store import KernelCacheSettings
from kimi_cluster.settings.keys import CREDENTIAL_KEYS, NAMESPACE, SECRET_KEYS
from kimi_cluster.settings.model import Settings
from kimi_cluster.settings.networks import IPV4_MIN_PREFIX, IPV4_WARN_PREFIX, IPV6_MIN_PREFIX, WIDE_PREFIX
from kimi_cluster.settings.ports import (
    DIST_INIT_PORT,
    RENDER_PORTS,
    RESERVED_PORTS,
    RESUME_PORT,
    SSH_PORT,
    WARMUP_DIST_INIT_PORT,
    WARMUP_ENGINE_PORT,
)
from kimi_cluster.settings.rules import (
    CACHE_STEP_MIN_MINUTES,
    DURATION_MAX_MINUTES,
    DURATION_MIN_MINUTES,
    MAX_LIST_ITEMS,
    NAME_MAX,
    credentials_problem,
    duration_problem,
    url_problem,
)
from kimi_cluster.settings.ssh_key import DEPLOY_KEY_HINT, private_key_problem

__all__ = [
    "CACHE_STEP_MIN_MINUTES", "CREDENTIAL_KEYS", "DEPLOY_KEY_HINT", "DIST_INIT_PORT", "DURATION_MAX_MINUTES",
    "DURATION_MIN_MINUTES", "ERROR_MAX_LINE", "ERROR_MAX_LINES", "EXAMPLES", "IPV4_MIN_PREFIX", "IPV4_WARN_PREFIX",
    "IPV6_MIN_PREFIX", "MAX_LIST_ITEMS", "NAMESPACE", "NAME_MAX", "RENDER_PORTS", "RESERVED_PORTS", "RESUME_PORT",
    "SECRET_KEYS", "SSH_PORT", "WARMUP_DIST_INIT_PORT", "WARMUP_ENGINE_PORT", "WIDE_PREFIX", "KernelCacheSettings",
    "Settings", "SettingsError", "how_to_set", "shown", "credentials_problem", "duration_problem",
    "private_key_problem", "url_problem",
]
