import asyncio

from steno.schemas.events import LoggedEvent
from steno.services.edge.sse import KEEPALIVE_COMMENT, EventStreamResponse, frame, sse_body


def event(seq: int, type_: str = "response.output_text.delta") -> LoggedEvent:
    return LoggedEvent(seq=seq, type=type_, payload=f'{{"sequence_number":{seq}}}')


def failure(last_seq: int) -> list[LoggedEvent]:
    return [event(last_seq + 1, "error"), event(last_seq + 2, "response.failed")]


def collect(runs) -> list[tuple[bytes, bool]]:
    async def go():
        return [chunk async for chunk in sse_body(runs, failure)]

    return asyncio.run(go())


def test_frames_carry_type_id_and_exact_payload():
    assert frame(event(7)) == b'event: response.output_text.delta\nid: 7\ndata: {"sequence_number":7}\n\n'


def test_a_run_is_one_chunk_and_the_terminal_one_is_last():
    async def runs():
        yield [event(0), event(1), event(2)]
        yield [event(3, "response.completed")]

    assert collect(runs()) == [(frame(event(0)) + frame(event(1)) + frame(event(2)), False),
                               (frame(event(3, "response.completed")), True)]


def test_an_empty_run_is_a_comment():
    async def runs():
        yield []
        yield [event(0, "response.completed")]

    assert collect(runs()) == [(KEEPALIVE_COMMENT, False), (frame(event(0, "response.completed")), True)]


def test_a_failure_ends_the_stream_visibly_after_the_last_event():
    async def runs():
        yield [event(0), event(1)]
        raise OSError("postgres went away")

    chunks = collect(runs())
    assert chunks[-1] == (frame(event(2, "error")) + frame(event(3, "response.failed")), True)


def test_leaving_early_closes_the_runs():
    closed = []

    async def runs():
        try:
            yield [event(0, "response.completed")]
            yield [event(1)]
        finally:
            closed.append(True)

    async def go():
        body = sse_body(runs(), failure)
        first = await body.__anext__()
        await body.aclose()
        return first

    assert asyncio.run(go())[1] and closed == [True]


def run_response(chunks, disconnect_after_s: float | None = None) -> list[dict]:
    """Drives the response as an ASGI server would; the client leaves after
    ``disconnect_after_s`` if given."""
    sent: list[dict] = []

    async def go():
        gone = asyncio.Event()

        async def receive():
            if disconnect_after_s is None:
                await asyncio.Event().wait()
            await asyncio.sleep(disconnect_after_s)
            gone.set()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await asyncio.wait_for(EventStreamResponse(chunks)({"type": "http"}, receive, send), 5)

    asyncio.run(go())
    return sent


def test_the_last_chunk_ends_the_body():
    async def runs():
        yield [event(0)]
        yield [event(1, "response.completed")]

    sent = run_response(sse_body(runs(), failure))
    assert sent[0]["type"] == "http.response.start" and (b"content-type", b"text/event-stream; charset=utf-8") in \
        sent[0]["headers"]
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(frame(event(0)), True),
                                                               (frame(event(1, "response.completed")), False)]


def test_a_client_that_leaves_stops_the_stream_and_its_tail():
    closed = []

    async def runs():
        try:
            yield [event(0)]
            await asyncio.sleep(60)
            yield [event(1, "response.completed")]
        finally:
            closed.append(True)

    sent = run_response(sse_body(runs(), failure), disconnect_after_s=0.05)
    assert [m["body"] for m in sent[1:]] == [frame(event(0))]
    assert closed == [True]
