"""docs/configuration.md holds the reference generated from the settings model, and the model's every key."""

from __future__ import annotations

from pathlib import Path

from kimi_cluster.cli import config_reference
from kimi_cluster.settings.loader import config_keys
from kimi_cluster.settings.reference import BEGIN, END, missing_notes, reference, rows, with_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_document_holds_todays_reference():
    text = DOC.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert with_reference(text) == text, "run kimi-cluster config-reference --write"


def test_every_key_has_a_row_and_a_note():
    assert missing_notes() == []
    assert [key for key, *_ in rows()] == sorted(config_keys(), key=[key for key, *_ in rows()].index)
    assert {key for key, *_ in rows()} == set(config_keys())


def test_the_rows_carry_the_models_defaults_bounds_and_choices():
    table = {key: (default, rule) for key, default, rule, _ in rows()}
    assert table["apiPort"] == ("`8000`", "a whole number, >= 1, <= 65535")
    assert table["operatorCidr"][0] == "**required**"
    assert table["verifySha256"][0] == "`true`"
    assert table["engineLayout"][1] == "one of `tp8`, `dp8-ep`, `tp8-dcp8`"
    assert table["stepDeadlineMinutes"][0] == "`{}`"
    assert table["kernelCache"][1].startswith("a JSON object: `backend` (`s3`), `bucket` (required)")
    assert table["hfToken"][1].startswith("secret")


def test_a_changed_default_makes_the_document_stale(monkeypatch, tmp_path, capsys):
    from kimi_cluster.settings.model import Settings

    field = Settings.model_fields["api_port"]
    monkeypatch.setattr(field, "default", 8443)
    assert "| `apiPort` | `8443` |" in reference()
    stale = tmp_path / "configuration.md"
    stale.write_text(DOC.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(config_reference, "DOC", stale)
    assert config_reference.main([]) == 1
    assert "out of date" in capsys.readouterr().err
    assert config_reference.main(["--write"]) == 0
    assert "| `apiPort` | `8443` |" in stale.read_text(encoding="utf-8")
