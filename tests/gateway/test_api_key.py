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
