"""The verl version guard of the trainer mode (``verl_gigpo.verl_version``): the versions its overrides of verl's
private trainer methods were checked against pass, any other fails with what to do, unless the escape hatch is set.
CPU only, no verl import."""

from __future__ import annotations

import pytest

from verl_gigpo.verl_version import ALLOW_ENV, SUPPORTED_VERL_VERSIONS, check_verl_version, installed_verl_version


def test_the_installed_verl_is_a_supported_one():
    assert SUPPORTED_VERL_VERSIONS == ("0.9.1",)
    assert installed_verl_version() == "0.9.1"
    assert check_verl_version(installed_verl_version()) is None


@pytest.mark.parametrize("version", ["0.10.0", "0.9.0", "0.9.1.dev0", "1.0"])
def test_another_version_is_refused_saying_what_to_do(version, monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(RuntimeError) as info:
        check_verl_version(version)
    message = str(info.value)
    assert message.startswith(f"verl {version} is installed, but verl_gigpo's gigpo_sync trainer mode was checked ")
    assert "against verl 0.9.1 only" in message
    assert "pip install 'verl[verl-core]==0.9.1'" in message
    assert f"set {ALLOW_ENV}=1 to run with this one at your own risk" in message


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_the_escape_hatch_lets_it_through_with_a_warning(value, monkeypatch, caplog):
    monkeypatch.setenv(ALLOW_ENV, value)
    assert check_verl_version("0.10.0") is None
    assert "verl 0.10.0 is installed; verl_gigpo's trainer mode was checked against verl 0.9.1 only" in caplog.text


@pytest.mark.parametrize("value", ["0", "", "no"])
def test_the_escape_hatch_needs_a_true_value(value, monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, value)
    with pytest.raises(RuntimeError, match="verl 0.10.0 is installed"):
        check_verl_version("0.10.0")
