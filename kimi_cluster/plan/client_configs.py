"""Ready-to-paste client settings (OpenAI SDK, Claude Code, Kimi Code, OpenClaw) for a deployed endpoint.
Pure; the key is only ever an env-var reference, since this becomes the plain `client_configs` output. The endpoint
serves TLS with a certificate from the stack's own CA, so each client is also told to trust that CA: Python clients
(the OpenAI SDK, Kimi Code) through SSL_CERT_FILE or an explicit SSL context, Node clients (Claude Code, OpenClaw)
through NODE_EXTRA_CA_CERTS, curl through --cacert.

Every value is written into its snippet quoted for that snippet's language (shell: `shlex.quote`; TOML: a basic
string; Python: `repr`; JSON: `json.dumps`), so a served model name or URL is always data when a person pastes it.
The only text left for a shell to expand is the key's variable reference, whose name is checked to be a plain one.
Quoting alone is not enough for what a terminal or an editor does with the text: a raw ESC survives `shlex.quote`,
and U+2028, U+2029 or U+0085 are line breaks to some editors and clipboards, which would end the Kimi Code heredoc
early. So this module refuses, on its own and whatever the settings allow, any value with a control character, a
format character (bidirectional overrides included) or a line or paragraph separator; TOML strings escape them too.
"""

from __future__ import annotations

import json
import re
import shlex
import unicodedata
from typing import Any

GET_KEY_COMMAND = "pulumi stack output api_key --show-secrets"
GET_CA_COMMAND = "pulumi stack output ca_certificate"
# Where the snippets expect the CA certificate; shell snippets expand $HOME, config files need the absolute path.
CA_PATH = "$HOME/.kimi-cluster/ca.pem"
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def _env_name(api_key_ref: str) -> str:
    """KIMI_API_KEY from "$KIMI_API_KEY", "${KIMI_API_KEY}" or "KIMI_API_KEY".

    Only upper-case variable names pass, so a key pasted here by mistake is refused, not published.
    """
    name = api_key_ref.strip()
    if name.startswith("${") and name.endswith("}"):
        name = name[2:-1]
    elif name.startswith("$"):
        name = name[1:]
    if not _ENV_NAME.match(name):
        raise ValueError(
            "api_key_ref must name an environment variable such as $KIMI_API_KEY "
            "(upper case, digits, underscores); the key itself never goes into client configs"
        )
    return name


_ROOT_URL = re.compile(r"https?://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::\d{1,5})?")


# Control (Cc: C0, DEL, C1 with U+0085), format (Cf: U+202E and the other bidi controls, zero-width characters),
# line and paragraph separators (Zl U+2028, Zp U+2029), surrogates and private use: none belongs in a model name.
_REFUSED_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


def _plain_text(value: str, what: str) -> str:
    """`value` if a terminal, an editor and every snippet language show it as the characters it is; else ValueError."""
    for ch in value:
        if unicodedata.category(ch) in _REFUSED_CATEGORIES:
            raise ValueError(f"{what} holds the character U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')}), a "
                             "control, format or line-separator character that pasted snippets must not carry")
    return value


def _endpoint_root(endpoint_url: str) -> str:
    url = endpoint_url.strip().rstrip("/").removesuffix("/v1")
    if not _ROOT_URL.fullmatch(url):
        raise ValueError(f"endpoint_url must look like http://HOST:PORT, got {endpoint_url!r}")
    return url


def toml_string(value: str) -> str:
    """A TOML basic string: backslash, quote and every control character escaped (TOML v1.0.0, "String")."""
    out = []
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or ch in "\u2028\u2029":
            # TOML forbids the C0 controls and DEL raw; the C1 controls and U+2028/U+2029 are legal but break lines
            # in some editors, so they are escaped too.
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _heredoc_literal(line: str) -> str:
    """A line inside an unquoted heredoc that the shell leaves as it is: `\\`, `$` and backquote escaped."""
    return line.replace("\\", "\\\\").replace("$", "\\$").replace("`", "\\`")


def _model_alias(served_model_name: str) -> str:
    return served_model_name.rsplit("/", 1)[-1].lower()


def build_client_configs(
    endpoint_url: str,
    served_model_name: str,
    context_window: int,
    api_key_ref: str = "$KIMI_API_KEY",
    engine: str = "sglang",
    max_output_tokens: int = 8192,
    ca_certificate: str | None = None,
) -> dict[str, Any]:
    """Client settings for the endpoint at `endpoint_url` (root, e.g. http://1.2.3.4:8000).

    `context_window` should stay within the KV cache the engine reported at start-up, since the
    clients use it to decide when to compact history. `engine` only names the OpenClaw provider.
    """
    if not served_model_name or not served_model_name.strip():
        raise ValueError("served_model_name must be the id the server lists at /v1/models")
    if isinstance(context_window, bool) or not isinstance(context_window, int) or context_window <= 0:
        raise ValueError(f"context_window must be a positive integer, got {context_window!r}")
    if engine not in ("sglang", "vllm", "tokenspeed"):
        raise ValueError(f"engine must be 'sglang', 'vllm' or 'tokenspeed', got {engine!r}")
    env = _env_name(api_key_ref)
    root = _endpoint_root(endpoint_url)
    base_v1 = root + "/v1"
    model = _plain_text(served_model_name.strip(), "served_model_name")
    ref = "${" + env + "}"
    export_key = f'export {env}="$({GET_KEY_COMMAND})"'
    tls = ca_certificate is not None
    save_ca = f'mkdir -p "$HOME/.kimi-cluster" && {GET_CA_COMMAND} > "{CA_PATH}"'

    claude_env = {
        "ANTHROPIC_BASE_URL": root,
        "ANTHROPIC_AUTH_TOKEN": ref,
        "API_TIMEOUT_MS": "3000000",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
    }
    if tls:
        # Claude Code is a Node program: Node adds this file to its trusted CAs.
        claude_env["NODE_EXTRA_CA_CERTS"] = CA_PATH
    claude_shell = "\n".join(
        f'export {k}="{ref}"' if v == ref else f"export {k}={shlex.quote(v)}" for k, v in claude_env.items()
    ) + "\nclaude"

    provider = "hyperstack"
    kimi_model_key = f"{provider}/{_model_alias(model)}"
    api_key_line = f"api_key = {toml_string(ref)}"
    kimi_toml = "\n".join([
        "# ~/.kimi-code/config.toml",
        f"default_model = {toml_string(kimi_model_key)}",
        "",
        f"[providers.{provider}]",
        'type = "openai"',
        f"base_url = {toml_string(base_v1)}",
        f"# the key itself: {GET_KEY_COMMAND}",
        api_key_line,
        "",
        f"[models.{toml_string(kimi_model_key)}]",
        f"provider = {toml_string(provider)}",
        f"model = {toml_string(model)}",
        f"max_context_size = {context_window}",
        'capabilities = ["thinking", "always_thinking", "image_in", "tool_use"]',
        'support_efforts = ["low", "high", "max"]',
        'default_effort = "high"',
    ])
    # An unquoted heredoc lets the shell put the key into the file, so the snippet itself holds none; every other
    # line is escaped so that the shell expands nothing else (no TOML line can equal the delimiter: strings are
    # quoted and hold no raw newline).
    heredoc = "\n".join(line if line == api_key_line else _heredoc_literal(line) for line in kimi_toml.splitlines())
    kimi_shell = (
        f"{export_key}\nmkdir -p ~/.kimi-code\n"
        f"cat >> ~/.kimi-code/config.toml <<KIMI_CODE_CONFIG\n{heredoc}\nKIMI_CODE_CONFIG"
    )
    if tls:
        # Kimi Code is a Python program; its HTTP client takes the trusted CAs from SSL_CERT_FILE.
        kimi_shell += f'\nexport SSL_CERT_FILE="{CA_PATH}"   # before starting kimi'


    openclaw_block = {
        "models": {
            "mode": "merge",
            "providers": {
                engine: {
                    "baseUrl": base_v1,
                    "apiKey": ref,
                    "api": "openai-completions",
                    "models": [
                        {
                            "id": model,
                            "name": "Kimi K3.1 Pro on Hyperstack",
                            "reasoning": True,
                            "input": ["text", "image"],
                            "contextWindow": context_window,
                            "maxTokens": max_output_tokens,
                        }
                    ],
                }
            },
        }
    }

    python = (
        "import os\nfrom openai import OpenAI\n"
        f"client = OpenAI(base_url={base_v1!r}, api_key=os.environ[{env!r}])\n"
        f"client.chat.completions.create(model={model!r}, "
        'messages=[{"role": "user", "content": "Hello"}], '
        'extra_body={"reasoning_effort": "low"})'
    )
    curl = f'curl -s {shlex.quote(base_v1 + "/models")} -H "Authorization: Bearer ${{{env}}}"'
    if tls:
        python = (
            "import os, ssl\nfrom openai import DefaultHttpxClient, OpenAI\n"
            "# or: export SSL_CERT_FILE=~/.kimi-cluster/ca.pem and leave http_client out\n"
            'ca = ssl.create_default_context(cafile=os.path.expanduser("~/.kimi-cluster/ca.pem"))\n'
            f"client = OpenAI(base_url={base_v1!r}, api_key=os.environ[{env!r}], "
            "http_client=DefaultHttpxClient(verify=ca))\n"
            f"client.chat.completions.create(model={model!r}, "
            'messages=[{"role": "user", "content": "Hello"}], '
            'extra_body={"reasoning_effort": "low"})'
        )
        curl = (f'curl -s --cacert "{CA_PATH}" {shlex.quote(base_v1 + "/models")} '
                f'-H "Authorization: Bearer ${{{env}}}"')
    openai_block: dict[str, Any] = {
        "base_url": base_v1,
        "model": model,
        "api_key_env": env,
        "python": python,
        "curl": curl,
    }
    openclaw: dict[str, Any] = {
        "path": "~/.openclaw/openclaw.json",
        "provider_block": openclaw_block,
        "json": json.dumps(openclaw_block, indent=2),
        "env": env,
        "set_model": f"openclaw models set {shlex.quote(f'{engine}/{model}')}",
    }
    configs: dict[str, Any] = {
        "api_key": {
            "env": env,
            "reference": ref,
            "how_to_get": GET_KEY_COMMAND,
            "export": export_key,
        },
        "openai": openai_block,
        "claude_code": {
            "env": claude_env,
            "shell": claude_shell,
            "note": (
                "ANTHROPIC_AUTH_TOKEN is sent as Authorization: Bearer, which is what SGLang and vLLM "
                f"check. In ~/.claude/settings.json no variable is expanded: paste the output of "
                f"`{GET_KEY_COMMAND}` there instead of {ref}."
            ),
        },
        "kimi_code": {
            "path": "~/.kimi-code/config.toml",
            "config_toml": kimi_toml,
            "shell": kimi_shell,
        },
        "openclaw": openclaw,
    }
    if tls:
        configs["ca_certificate"] = {
            "pem": ca_certificate,
            "path": CA_PATH,
            "save": save_ca,
            "how_to_get": GET_CA_COMMAND,
        }
        openai_block["env"] = {"SSL_CERT_FILE": CA_PATH}
        # OpenClaw runs on Node: the same variable as Claude Code, set where the gateway starts.
        openclaw["ca_env"] = {"NODE_EXTRA_CA_CERTS": CA_PATH}
    return configs
