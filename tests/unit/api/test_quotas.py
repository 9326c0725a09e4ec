import itertools

import pytest

from steno.services.api.quotas import (
    CONCURRENCY_RETRY_S,
    Quota,
    Usage,
    decide,
    rate_limit_headers,
    seconds_to_next_window,
    window_of,
)

# 20.25 s into a minute.
NOW = 1_800_000_000.0 + 20.25
START = 1_800_000_000.0


def test_windows_are_whole_minutes_since_the_epoch():
    assert window_of(START) == 30_000_000
    assert window_of(START + 59.999) == 30_000_000
    assert window_of(START + 60) == 30_000_001
    assert window_of(START - 0.001) == 29_999_999


@pytest.mark.parametrize(("offset", "retry"), [(0.0, 60), (20.25, 40), (59.0, 1), (59.5, 1), (59.999, 1), (1.0, 59)])
def test_retry_after_is_the_whole_seconds_to_the_next_window_at_least_one(offset, retry):
    assert seconds_to_next_window(START + offset) == retry


def test_no_limits_admit_any_usage():
    assert decide(Quota(), Usage(requests=10**9, tokens=10**12, running=10**6), NOW) is None


def test_requests_per_minute_refuses_the_request_over_the_limit_until_the_window_ends():
    quota = Quota(requests_per_minute=3)
    assert decide(quota, Usage(2, 0, 0), NOW) is None
    refusal = decide(quota, Usage(3, 0, 0), NOW)
    assert refusal is not None
    assert (refusal.kind, refusal.retry_after_s) == ("requests", 40)
    assert "Limit 3, Used 3" in refusal.message and "40s" in refusal.message
    assert decide(quota, Usage(7, 0, 0), NOW) is not None


def test_tokens_per_minute_refuses_once_the_window_is_at_or_over_the_limit():
    quota = Quota(tokens_per_minute=1000)
    assert decide(quota, Usage(50, 999, 0), NOW) is None
    for used in (1000, 5000):
        refusal = decide(quota, Usage(1, used, 0), NOW)
        assert refusal is not None
        assert (refusal.kind, refusal.retry_after_s) == ("tokens", 40)
        assert f"Limit 1000, Used {used}" in refusal.message


def test_concurrency_refuses_while_the_limit_is_running_and_asks_for_a_quick_retry():
    quota = Quota(concurrent_generations=2)
    assert decide(quota, Usage(100, 100, 1), NOW) is None
    refusal = decide(quota, Usage(0, 0, 2), NOW)
    assert refusal is not None
    assert (refusal.kind, refusal.retry_after_s) == ("requests", CONCURRENCY_RETRY_S)
    assert "concurrent generations" in refusal.message


@pytest.mark.parametrize(("requests_full", "tokens_full", "running_full"),
                         list(itertools.product((False, True), repeat=3)))
def test_every_combination_refuses_for_the_first_limit_reached_in_order(requests_full, tokens_full, running_full):
    quota = Quota(requests_per_minute=5, concurrent_generations=1, tokens_per_minute=100)
    usage = Usage(5 if requests_full else 4, 100 if tokens_full else 99, 1 if running_full else 0)
    refusal = decide(quota, usage, NOW)
    if requests_full:
        expected: tuple[str, int] | None = ("requests", 40)
    elif tokens_full:
        expected = ("tokens", 40)
    elif running_full:
        expected = ("requests", CONCURRENCY_RETRY_S)
    else:
        expected = None
    assert (None if refusal is None else (refusal.kind, refusal.retry_after_s)) == expected


def test_headers_carry_retry_after_and_the_per_minute_limits_the_tenant_has():
    quota = Quota(requests_per_minute=3, tokens_per_minute=1000)
    usage = Usage(3, 400, 0)
    refusal = decide(quota, usage, NOW)
    assert refusal is not None
    assert rate_limit_headers(quota, usage, refusal, NOW) == {
        "Retry-After": "40",
        "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "40s",
        "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "600", "x-ratelimit-reset-tokens": "40s",
    }


def test_headers_of_a_concurrency_refusal_name_no_per_minute_limit_it_lacks():
    quota = Quota(concurrent_generations=1)
    usage = Usage(10, 10, 1)
    refusal = decide(quota, usage, NOW)
    assert refusal is not None
    assert rate_limit_headers(quota, usage, refusal, NOW) == {"Retry-After": str(CONCURRENCY_RETRY_S)}


def test_remaining_never_goes_below_zero():
    quota = Quota(tokens_per_minute=10)
    usage = Usage(0, 25, 0)
    refusal = decide(quota, usage, NOW)
    assert refusal is not None
    assert rate_limit_headers(quota, usage, refusal, NOW)["x-ratelimit-remaining-tokens"] == "0"
