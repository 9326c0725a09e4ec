"""Following responses' live events on real NATS: the responses an API process made
arrive on its one origin subscription; any other response on a subscription of its own."""

import asyncio

import nats
import pytest

from steno.schemas.events import CommittedEvents, LoggedEvent
from steno.schemas.ids import new_origin, new_response_id, origin_of
from steno.services.common.bus import Names
from steno.services.edge import ResponseTail

pytestmark = pytest.mark.integration


def committed(response_id: str, seq: int) -> bytes:
    event = LoggedEvent(seq=seq, type="response.output_text.delta", payload=f'{{"sequence_number":{seq}}}')
    return CommittedEvents(response_id=response_id, events=[event]).model_dump_json().encode()


@pytest.fixture
async def tail(settings):
    nc = await nats.connect(settings.nats_url)
    names = Names.from_settings(settings)
    origin = new_origin()
    following = ResponseTail(nc, None, names.events_subject, origin, names.origin_events(origin))
    await following.start()
    yield nc, names, origin, following
    await following.stop()
    await nc.close()


async def next_seqs(live, timeout_s: float = 2.0) -> list[int]:
    return [event.seq for event in (await asyncio.wait_for(live.queue.get(), timeout_s)).events]


def test_an_id_carries_its_origin():
    origin = new_origin()
    made_here = new_response_id(origin)
    assert origin_of(made_here) == origin and len(made_here) == len(new_response_id())
    assert origin_of(new_response_id()) != origin


async def test_responses_made_here_share_the_origin_subscription(tail):
    nc, names, origin, following = tail
    mine, other_of_mine = new_response_id(origin), new_response_id(origin)
    first, second = await following.listen(mine), await following.listen(mine)
    assert first.subscription is None and second.subscription is None  # no NATS subscription each
    await nc.publish(names.events_subject(other_of_mine), committed(other_of_mine, 5))
    await nc.publish(names.events_subject(mine), committed(mine, 1))
    assert await next_seqs(first) == [1] and await next_seqs(second) == [1]
    assert first.queue.empty()
    await first.close()
    await nc.publish(names.events_subject(mine), committed(mine, 2))
    assert await next_seqs(second) == [2]
    await second.close()
    assert following._following == {}  # nothing left behind for a finished stream


async def test_a_response_made_elsewhere_is_followed_on_its_own_subject(tail):
    nc, names, _, following = tail
    elsewhere = new_response_id()
    live = await following.listen(elsewhere)
    assert live.subscription is not None
    await nc.flush()  # the subscription is in place before the publish
    await nc.publish(names.events_subject(elsewhere), committed(elsewhere, 3))
    assert await next_seqs(live) == [3]
    await live.close()
