"""The settings models: what the environment sets, what it refuses, and that the README's
configuration table documents every variable with its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from steno.services.common.config import ApiSettings, ParserSettings, Settings, WorkerSettings, describe_invalid

README = Path(__file__).resolve().parents[3] / "README.md"
MODELS = (Settings, ApiSettings, WorkerSettings, ParserSettings)


def _variable(model: type[Settings], field: str) -> str:
    alias = model.model_fields[field].validation_alias
    named = [choice for choice in getattr(alias, "choices", []) if str(choice).startswith("STENO_")]
    return str(named[0]) if named else f"STENO_{field.upper()}"


def _configuration_table() -> dict[str, str]:
    """variable -> its default column, from the README's configuration table."""
    section = README.read_text().split("## Configuration", 1)[1]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            for variable in re.findall(r"`([A-Z_]+)`", cells[0]):
                rows[variable] = cells[1]
    return rows


def _documented_default(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_every_setting_is_in_the_readme_table_with_its_default(model: type[Settings]) -> None:
    table = _configuration_table()
    for field, info in model.model_fields.items():
        variable = _variable(model, field)
        assert variable in table, f"{variable} is missing from the README's configuration table"
        if info.validation_alias is not None:
            continue  # a variable that reads as words (STENO_AUTH=disabled), documented as such
        if info.default is None:
            assert table[variable] in ("unset", "system CAs"), f"{variable}: default is unset"
        else:
            assert table[variable] == _documented_default(info.default), f"{variable}: default {info.default!r}"


def test_the_environment_sets_each_service_s_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STENO_AUTH", "disabled")
    monkeypatch.setenv("STENO_MODEL_WAIT_S", "2.5")
    monkeypatch.setenv("STENO_LOG_FORMAT", "json")
    monkeypatch.setenv("STENO_LOG_LEVEL", "debug")
    monkeypatch.setenv("STENO_METRICS_PORT", "9400")
    monkeypatch.setenv("STENO_NATS_USER", "")

    api = ApiSettings.from_env()
    assert (api.auth_disabled, api.model_wait_s, api.log_format, api.log_level) == (True, 2.5, "json", "DEBUG")
    assert api.nats_user is None
    assert WorkerSettings.from_env().metrics_port == 9400
    assert ParserSettings.from_env().metrics_port == 9400
    monkeypatch.setenv("STENO_AUTH", "required")
    assert ApiSettings.from_env().auth_disabled is False


@pytest.mark.parametrize(("variable", "value"), [
    ("STENO_AUTH", "off"),
    ("STENO_LOG_FORMAT", "xml"),
    ("STENO_LOG_LEVEL", "loud"),
    ("STENO_TOKEN_PARTITIONS", "0"),
    ("STENO_MODEL_WAIT_S", "soon"),
    ("STENO_METRICS_PORT", "70000"),
])
def test_a_bad_value_is_refused_naming_its_setting(monkeypatch: pytest.MonkeyPatch, variable: str,
                                                   value: str) -> None:
    monkeypatch.setenv(variable, value)
    model = WorkerSettings if variable == "STENO_METRICS_PORT" else ApiSettings
    with pytest.raises(ValidationError) as refused:
        model.from_env()
    field = "auth_disabled" if variable == "STENO_AUTH" else variable.removeprefix("STENO_").lower()
    assert field in str(refused.value)


def test_changed_settings_are_checked_again() -> None:
    settings = ApiSettings(namespace="a", model_wait_s=1)
    assert settings.with_changes(namespace="b").namespace == "b"
    assert settings.with_changes(namespace="b").model_wait_s == 1
    with pytest.raises(ValidationError):
        settings.with_changes(token_partitions=0)


def test_the_partition_count_is_chosen_only_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count left at the default gives way to the deployment's stream (bus.deployment_names),
    through every change of the other settings; one asked for does not."""
    defaulted = ApiSettings(namespace="a")
    assert not defaulted.token_partitions_chosen
    assert not defaulted.with_changes(namespace="b", model_wait_s=3).token_partitions_chosen
    assert defaulted.with_changes(token_partitions=8).token_partitions_chosen
    monkeypatch.setenv("STENO_TOKEN_PARTITIONS", "16")
    from_env = ApiSettings.from_env()
    assert (from_env.token_partitions, from_env.token_partitions_chosen) == (16, True)
    assert from_env.with_changes(namespace="b").token_partitions_chosen


def test_a_refused_setting_is_described_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STENO_LOG_FORMAT", "xml")
    monkeypatch.setenv("STENO_AUTH", "off")
    with pytest.raises(ValidationError) as refused:
        ApiSettings.from_env()
    lines = describe_invalid(refused.value)
    assert any(line.startswith("STENO_LOG_FORMAT: ") and "'json'" in line for line in lines)
    assert any(line.startswith("STENO_AUTH: ") for line in lines)
