"""NATS credentials and TLS settings: what they become for nats-py, and every way they
can be wrong (each error names the variable to fix)."""

import os
import re
import ssl

import certifi
import pytest

from steno.services.common.config import Settings
from steno.services.common.nats_options import NatsOptions, NatsSettingsError, redact_url

# The layout of a .creds file (what is checked before nats-py reads one); the JWT and
# the seed are placeholders.
CREDS_LAYOUT = """-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln
------END NATS USER JWT------

-----BEGIN USER NKEY SEED-----
SUPLACEHOLDER
------END USER NKEY SEED------
"""


def settings(url: str = "nats://127.0.0.1:4222", **security) -> Settings:
    return Settings(nats_url=url, database_url="postgresql://x/y", namespace="t", token_partitions=1, **security)


def test_a_bare_url_connects_as_before():
    kwargs = NatsOptions.from_settings(settings()).connect_kwargs()
    assert kwargs == {"servers": ["nats://127.0.0.1:4222"]}


def test_credentials_in_the_url_become_user_and_password_for_every_server():
    options = NatsOptions.from_settings(settings("nats://steno:p%40ss%3Aword@a:4222, nats://steno:p%40ss%3Aword@b:4222,c"))
    kwargs = options.connect_kwargs()
    # Passed on their own, they reach servers listed without them too, decoded.
    assert kwargs["servers"] == ["nats://a:4222", "nats://b:4222", "nats://c"]
    assert (kwargs["user"], kwargs["password"]) == ("steno", "p@ss:word")
    assert "tls" not in kwargs


def test_a_url_user_without_a_password_is_a_token():
    kwargs = NatsOptions.from_settings(settings("nats://s3cr3t@a:4222")).connect_kwargs()
    assert kwargs["token"] == "s3cr3t" and "user" not in kwargs


def test_servers_with_different_credentials_are_an_error():
    with pytest.raises(NatsSettingsError, match="STENO_NATS_URL: its servers carry different credentials"):
        settings("nats://a:1@x:4222,nats://a:2@y:4222")


def test_the_url_scheme_must_be_nats_or_tls():
    with pytest.raises(NatsSettingsError, match=r"STENO_NATS_URL: http://x:4222 is neither"):
        settings("http://u:secret@x:4222")


def test_user_and_password_from_their_own_variables():
    kwargs = NatsOptions.from_settings(settings(nats_user="steno", nats_password="pw")).connect_kwargs()
    assert (kwargs["user"], kwargs["password"]) == ("steno", "pw")


@pytest.mark.parametrize(("given", "missing"), [({"nats_user": "steno"}, "STENO_NATS_PASSWORD"),
                                                ({"nats_password": "pw"}, "STENO_NATS_USER")])
def test_user_and_password_go_together(given, missing):
    with pytest.raises(NatsSettingsError, match=f"but {missing} is not"):
        settings(**given)


def test_credentials_in_the_url_and_in_the_variables_are_an_error():
    with pytest.raises(NatsSettingsError, match="both in STENO_NATS_URL and in STENO_NATS_USER/STENO_NATS_PASSWORD"):
        settings("nats://a:b@x:4222", nats_user="steno", nats_password="pw")


def test_one_way_of_authenticating_at_a_time(tmp_path):
    creds, seed = tmp_path / "u.creds", tmp_path / "u.nk"
    creds.write_text(CREDS_LAYOUT)
    seed.write_text("SU...")
    with pytest.raises(NatsSettingsError, match="more than one way"):
        settings(nats_creds=str(creds), nats_nkey_seed=str(seed))
    with pytest.raises(NatsSettingsError, match="more than one way"):
        settings("nats://a:b@x:4222", nats_creds=str(creds))


@pytest.mark.parametrize(("field", "variable"), [
    ("nats_tls_ca", "STENO_NATS_TLS_CA"),
    ("nats_creds", "STENO_NATS_CREDS"),
    ("nats_nkey_seed", "STENO_NATS_NKEY_SEED"),
])
def test_a_missing_file_names_its_variable(tmp_path, field, variable):
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(NatsSettingsError, match=re.escape(f"{variable}: no such file: {missing}")):
        settings(**{field: str(missing)})


def test_a_client_certificate_needs_its_key(tmp_path):
    with pytest.raises(NatsSettingsError, match="STENO_NATS_TLS_CERT and STENO_NATS_TLS_KEY go together"):
        settings(nats_tls_cert=certifi.where())


def test_a_ca_turns_tls_on_and_verifies_the_server_by_name():
    options = NatsOptions.from_settings(settings(nats_tls_ca=certifi.where()))
    context = options.connect_kwargs()["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_the_tls_scheme_alone_turns_tls_on_with_the_system_cas():
    options = NatsOptions.from_settings(settings("tls://x:4222"))
    assert options.tls and isinstance(options.connect_kwargs()["tls"], ssl.SSLContext)
    assert options.connect_kwargs()["servers"] == ["tls://x:4222"]


def test_a_file_that_is_no_ca_bundle_is_named(tmp_path):
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    options = NatsOptions.from_settings(settings(nats_tls_ca=str(bogus)))
    with pytest.raises(NatsSettingsError, match=re.escape(f"STENO_NATS_TLS_CA: {bogus} is not a usable PEM CA bundle")):
        options.connect_kwargs()


def test_a_creds_file_becomes_user_credentials(tmp_path):
    pytest.importorskip("nkeys")
    creds = tmp_path / "u.creds"
    creds.write_text(CREDS_LAYOUT)
    kwargs = NatsOptions.from_settings(settings(nats_creds=str(creds))).connect_kwargs()
    assert kwargs == {"servers": ["nats://127.0.0.1:4222"], "user_credentials": str(creds)}


def test_a_file_that_is_no_creds_file_is_named(tmp_path):
    pytest.importorskip("nkeys")
    creds = tmp_path / "u.creds"
    creds.write_text("user: steno\n")
    with pytest.raises(NatsSettingsError, match=r"STENO_NATS_CREDS: .* is not a NATS \.creds file"):
        settings(nats_creds=str(creds))


def test_an_nkey_seed_file_becomes_nkeys_seed(tmp_path):
    nkeys = pytest.importorskip("nkeys")
    seed = tmp_path / "user.nk"
    seed.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) + b"\n")
    kwargs = NatsOptions.from_settings(settings(nats_nkey_seed=str(seed))).connect_kwargs()
    assert kwargs == {"servers": ["nats://127.0.0.1:4222"], "nkeys_seed": str(seed)}


def test_a_file_that_holds_no_seed_is_named_without_its_content(tmp_path):
    pytest.importorskip("nkeys")
    seed = tmp_path / "user.nk"
    seed.write_text("SECRET-BUT-WRONG\n")
    with pytest.raises(NatsSettingsError, match=r"STENO_NATS_NKEY_SEED: .* does not hold an nkey seed") as raised:
        settings(nats_nkey_seed=str(seed))
    assert "SECRET-BUT-WRONG" not in str(raised.value)


def test_from_env_reads_and_checks_every_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("STENO_NATS_URL", "tls://nats-0.nats:4222,tls://nats-1.nats:4222")
    monkeypatch.setenv("STENO_NATS_USER", "steno")
    monkeypatch.setenv("STENO_NATS_PASSWORD", "from-a-secret")
    monkeypatch.setenv("STENO_NATS_TLS_CA", certifi.where())
    loaded = Settings.from_env()
    assert (loaded.nats_user, loaded.nats_password, loaded.nats_tls_ca) == ("steno", "from-a-secret", certifi.where())
    monkeypatch.setenv("STENO_NATS_TLS_CA", str(tmp_path / "missing-ca.crt"))
    with pytest.raises(NatsSettingsError, match="STENO_NATS_TLS_CA: no such file"):
        Settings.from_env()


def test_no_secret_shows_in_reprs_descriptions_or_redacted_urls():
    loaded = settings("tls://x:4222", nats_user="steno", nats_password="hunter2")
    options = NatsOptions.from_settings(loaded)
    for text in (repr(loaded), repr(options), options.describe()):
        assert "hunter2" not in text
    from_url = NatsOptions.from_url("nats://steno:hunter2@a:4222,nats://steno:hunter2@b:4222")
    assert "hunter2" not in repr(from_url) and "hunter2" not in from_url.describe()
    assert redact_url("nats://steno:hunter2@a:4222, tls://b:4222") == "nats://a:4222,tls://b:4222"
