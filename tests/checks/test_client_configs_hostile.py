"""kimi_cluster/plan/client_configs.py on its own, without the settings' name rule: a served name carrying a line
separator
or a control character is refused for every snippet, and TOML strings escape them anyway. The attack: U+2028 in the
name closed the Kimi Code heredoc when an editor or clipboard turned it into a newline, and the rest ran."""

from __future__ import annotations

import os
import subprocess

import pytest

from kimi_cluster.plan.client_configs import build_client_configs, toml_string

URL = "http://203.0.113.7:8000"
PAYLOAD = "touch \"$PWNED\""


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085", "\x1b", "\n", "\r", "\x00", "\u202e", "\u200b",
                                 "\x9b"])
def test_a_served_name_with_a_separator_or_control_character_is_refused(sep):
    with pytest.raises(ValueError, match=rf"served_model_name holds the character U\+{ord(sep):04X}"):
        build_client_configs(URL, f"kimi{sep}KIMI_CODE_CONFIG{sep}{PAYLOAD}{sep}", 4096)


def test_what_the_heredoc_would_have_run_if_the_name_had_passed(tmp_path):
    """The attack as a paste would run it: an editor turns U+2028 into a newline. With an ordinary name, the pasted
    snippet writes the config and runs nothing; the hostile name never gets a snippet at all."""
    configs = build_client_configs(URL, "moonshotai/Kimi-K3.1-Pro", 4096)
    shell = configs["kimi_code"]["shell"].replace("\u2028", "\n")
    shell = shell.replace("$(pulumi stack output api_key --show-secrets)", "sk-test")
    env = {**os.environ, "HOME": str(tmp_path), "PWNED": str(tmp_path / "pwned")}
    subprocess.run(["bash", "-c", shell], env=env, check=True, capture_output=True, timeout=30)
    assert not (tmp_path / "pwned").exists()
    assert 'model = "moonshotai/Kimi-K3.1-Pro"' in (tmp_path / ".kimi-code/config.toml").read_text()


@pytest.mark.parametrize("ch", ["\u2028", "\u2029", "\u0085", "\x1b", "\x7f", "\x9f"])
def test_toml_strings_escape_line_separators_and_c1_controls(ch):
    assert toml_string(f"a{ch}b") == f'"a\\u{ord(ch):04X}b"'


def test_ordinary_names_still_pass():
    for name in ("moonshotai/Kimi-K3.1-Pro", "kimi-k3.1 pro", "Kimi_K3.1@rev2", "模型-名"):
        assert build_client_configs(URL, name, 4096)["openai"]["model"] == name
