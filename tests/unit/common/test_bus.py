"""Asking JetStream again while a process starts: which failures are waited out, and for
how long."""

from __future__ import annotations

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import BadRequestError, ServiceUnavailableError

from steno.services.common import bus


class Flaky:
    """A request that fails with ``errors`` in turn, then answers ``answer``."""

    def __init__(self, errors: list[Exception], answer: str = "declared") -> None:
        self.errors = list(errors)
        self.answer = answer
        self.asked = 0

    async def __call__(self) -> str:
        self.asked += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.answer


@pytest.mark.parametrize("error", [NatsTimeoutError(), NoRespondersError(), ServiceUnavailableError()])
def test_a_request_unanswered_for_want_of_time_counts_as_unanswered(error):
    assert bus.unanswered(error)


@pytest.mark.parametrize("error", [BadRequestError(), ValueError("bad config"), ConnectionRefusedError()])
def test_a_request_refused_for_cause_does_not(error):
    assert not bus.unanswered(error)


async def test_a_request_is_asked_again_until_it_is_answered(caplog):
    request = Flaky([NatsTimeoutError(), ServiceUnavailableError(), NoRespondersError()])
    assert await bus.patiently(request, "declaring stream S") == "declared"
    assert request.asked == 4
    waits = [record.getMessage() for record in caplog.records if "did not answer" in record.getMessage()]
    assert len(waits) == 3 and all(message.startswith("declaring stream S") for message in waits)


async def test_once_patience_is_spent_the_error_says_what_waited_and_what_to_check():
    request = Flaky([ServiceUnavailableError()] * 50)
    with pytest.raises(bus.JetStreamUnanswered) as gave_up:
        await bus.patiently(request, "opening bucket B", patience_s=0.5)
    # Waits double from the first: 0.1, 0.2 fit in half a second, the next would not.
    assert request.asked == 3
    assert str(gave_up.value).startswith("opening bucket B: JetStream did not answer for 0.5 s")
    assert "is JetStream enabled on the NATS server" in str(gave_up.value)
    assert isinstance(gave_up.value.__cause__, ServiceUnavailableError)


async def test_an_error_that_would_come_again_is_raised_at_once():
    request = Flaky([BadRequestError(description="stream name in use")])
    with pytest.raises(BadRequestError):
        await bus.patiently(request, "declaring stream S")
    assert request.asked == 1
