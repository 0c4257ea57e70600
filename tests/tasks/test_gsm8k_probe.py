"""The GSM8K data probe of tests/conftest.py remembers its answer per data source and per the functions that find
and load the data: a test that replaces one (the hub's loader, the local copy's finder) gets its own probe, not the
answer the real functions gave earlier in the same process (a fresh clone without ../shared: the real probe's
reason, then the monkeypatched test read that reason instead of its own)."""

from tests import conftest


def test_a_replaced_loader_is_probed_again_not_answered_from_the_cache(monkeypatch):
    from tasks import gsm8k

    monkeypatch.setattr(conftest, "_GSM8K_PROBES", {})
    monkeypatch.delenv(gsm8k.ENV_DATA, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(gsm8k, "local_copy", lambda: None)

    def unreachable(name, split):
        raise ConnectionError("first probe")

    monkeypatch.setattr(gsm8k, "_load_hub", unreachable)
    assert "(first probe)" in conftest.gsm8k_unavailable()  # what a first probe in the session found

    def offline(name, split):
        raise ConnectionError("offline")

    monkeypatch.setattr(gsm8k, "_load_hub", offline)  # what a later test replaces, with the same data source
    reason = conftest.gsm8k_unavailable()
    assert "(offline)" in reason and "first probe" not in reason
