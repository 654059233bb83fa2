from __future__ import annotations

from tgi_llm.gateway.api_key import ApiKey


def test_no_key_lets_everyone_in():
    assert ApiKey(None).allows(None) and ApiKey(None).allows("Bearer anything")


def test_only_the_bearer_key_is_accepted():
    key = ApiKey("s3cret")
    assert key.allows("Bearer s3cret") and key.allows(b"bearer s3cret") and key.allows("Bearer  s3cret ")
    for wrong in (None, "", "s3cret", "Bearer", "Bearer wrong", "Basic s3cret", "Bearer s3cret2", "Bearer s3cre"):
        assert not key.allows(wrong), wrong


def test_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("API_KEY", "k")
    assert ApiKey.from_env() == ApiKey("k")
    monkeypatch.setenv("API_KEY", "")
    assert ApiKey.from_env() == ApiKey(None)


def test_the_scheme_is_case_insensitive_and_the_key_exact():
    key = ApiKey("SeCret")
    assert key.allows("BEARER SeCret") and key.allows("bEaReR SeCret")
    for wrong in ("Bearer secret", "Bearer SECRET", "bearer secret", "Bearer SeCret\x00"):
        assert not key.allows(wrong), wrong


def test_a_non_ascii_key_is_compared_as_the_utf8_bytes_clients_send():
    key = ApiKey("clé")
    assert key.allows("Bearer clé".encode().decode("latin-1"))  # how ASGI decodes the header's bytes
    assert not key.allows("Bearer cle")


def test_upstream_forwards_the_canonical_header():
    assert ApiKey("k").upstream("bearer k") == "Bearer k"
    assert ApiKey(None).upstream("whatever") == "whatever"
