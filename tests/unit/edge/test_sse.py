import asyncio

from schemas.events import LoggedEvent
from services.edge.sse import KEEPALIVE_COMMENT, frame, sse_body


def event(seq: int, type_: str = "response.output_text.delta") -> LoggedEvent:
    return LoggedEvent(seq=seq, type=type_, payload=f'{{"sequence_number":{seq}}}')


def failure(last_seq: int) -> list[LoggedEvent]:
    return [event(last_seq + 1, "error"), event(last_seq + 2, "response.failed")]


def collect(runs, keepalive_s=15.0) -> list[bytes]:
    async def go():
        return [chunk async for chunk in sse_body(runs, failure, keepalive_s)]

    return asyncio.run(go())


def test_frames_carry_type_id_and_exact_payload():
    assert frame(event(7)) == b'event: response.output_text.delta\nid: 7\ndata: {"sequence_number":7}\n\n'


def test_a_run_is_one_chunk():
    async def runs():
        yield [event(0), event(1), event(2)]
        yield [event(3, "response.completed")]

    chunks = collect(runs())
    assert chunks == [frame(event(0)) + frame(event(1)) + frame(event(2)), frame(event(3, "response.completed"))]


def test_silence_sends_comments():
    async def runs():
        await asyncio.sleep(0.25)
        yield [event(0, "response.completed")]

    chunks = collect(runs(), keepalive_s=0.1)
    assert chunks[:2] == [KEEPALIVE_COMMENT, KEEPALIVE_COMMENT]
    assert chunks[-1] == frame(event(0, "response.completed"))


def test_a_failure_ends_the_stream_visibly_after_the_last_event():
    async def runs():
        yield [event(0), event(1)]
        raise OSError("postgres went away")

    chunks = collect(runs())
    assert chunks[-1] == frame(event(2, "error")) + frame(event(3, "response.failed"))
