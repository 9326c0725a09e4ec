import math

import orjson
import pytest

from steno.benchmarks.steady import (
    AnnouncementFollower,
    Announcements,
    BatchFollower,
    Emission,
    added_latencies_ms,
    all_running,
    content_marks,
    delta_frames,
    largest_held,
    next_level,
    stage_latencies_ms,
    summary_ms,
)
from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import TokenBatch
from steno.schemas.responses import ParseContext
from steno.services.api.response_plan import plan_response
from steno.services.dialects import DEFAULT_DIALECT, dialect_named
from steno.services.parser.response_state import ResponseState
from steno.services.worker.simulator import completion_tokens

RESPONSE_ID = "resp_steady"


def parsed_stream(batch_sizes: list[int]) -> tuple[list[Emission], list[tuple[int, str]]]:
    """A simulated 120-token completion cut into batches (batch i emitted at second i),
    and the deltas Steno's parser makes of them, each with the batch that produced it."""
    dialect = dialect_named(DEFAULT_DIALECT)
    request = CreateResponseRequest(model="m", input="a long answer, please")
    plan = plan_response(request, RESPONSE_ID, "t", 1_700_000_000, dialect.render(request, 1_700_000_000))
    tokens = completion_tokens(dialect, plan.generation.prompt_token_ids, min_tokens=120)
    context = ParseContext.model_validate(plan.record.parse_context)
    state = ResponseState(RESPONSE_ID, plan.record.base_snapshot, context)
    emissions, deltas, start = [], [], 0
    for batch_no, size in enumerate(batch_sizes):
        batch = TokenBatch(response_id=RESPONSE_ID, attempt=0, batch_no=batch_no, token_ids=tokens[start:start + size])
        start += size
        emissions.append(Emission(float(batch_no), batch.token_ids))
        applied = state.apply_batch(batch)
        for event in applied.events if applied else []:
            if event.type.endswith(".delta"):
                deltas.append((batch_no, orjson.loads(event.payload)["delta"]))
    assert start >= len(tokens)
    return emissions, deltas


@pytest.mark.parametrize("batch_sizes", [[1] * 130, [7] * 20, [40, 1, 1, 30, 60], [130]])
def test_each_delta_is_measured_against_the_batch_that_produced_it(batch_sizes):
    emissions, deltas = parsed_stream(batch_sizes)
    assert len(deltas) > 1 or batch_sizes == [130]
    # Each delta arrives 0.25 s after its batch's emission, plus a millisecond per batch number.
    arrivals = [(batch_no + 0.25 + batch_no / 1000, text) for batch_no, text in deltas]
    marks = content_marks(dialect_named(DEFAULT_DIALECT).splitter(ParseContext()), emissions)
    latencies, unmatched = added_latencies_ms(emissions, marks, arrivals)
    assert unmatched == 0
    assert [emitted for emitted, _ in latencies] == [float(batch_no) for batch_no, _ in deltas]
    assert [added for _, added in latencies] == pytest.approx([250 + batch_no for batch_no, _ in deltas])


def test_content_beyond_every_batch_is_counted_unmatched():
    emissions = [Emission(0.0, [1])]
    latencies, unmatched = added_latencies_ms(emissions, [3], [(0.01, "abc"), (0.02, "d")])
    assert len(latencies) == 1 and latencies[0] == pytest.approx((0.0, 10.0)) and unmatched == 1


def test_all_running_spans_the_last_start_to_the_first_end():
    streams = {"early": [Emission(0.0, [1]), Emission(10.0, [2]), Emission(20.0, [3])],
               "late": [Emission(0.9, [1]), Emission(20.9, [2])],
               "silent": []}
    assert all_running(streams) == (0.9, 20.0)


def test_streams_that_never_overlap_were_never_all_running():
    assert all_running({"first": [Emission(0.0, [1]), Emission(1.0, [2])],
                        "second": [Emission(2.0, [1]), Emission(3.0, [2])]}) is None
    assert all_running({}) is None


def test_the_summary_gives_p50_p99_and_max():
    summary = summary_ms([float(v) for v in range(1, 101)])
    assert (summary["p50"], summary["p99"], summary["max"]) == (51.0, 99.0, 100.0)
    assert all(math.isnan(v) for v in summary_ms([]).values())


def test_the_search_doubles_while_every_level_is_under_the_limit():
    assert next_level({8: 3.0, 16: 4.0}, 50, 1024) == 32
    assert next_level({512: 30.0}, 50, 1024) == 1024
    assert next_level({1024: 30.0}, 50, 1024) is None


def test_the_search_bisects_between_the_last_level_under_and_the_first_over():
    assert next_level({64: 20.0, 256: 80.0}, 50, 1024) == 160
    assert next_level({64: 20.0, 160: 40.0, 256: 80.0}, 50, 1024) == 208
    assert next_level({64: 20.0, 160: 40.0, 208: 60.0}, 50, 1024) == 184
    assert next_level({64: 20.0, 184: 40.0, 208: 60.0}, 50, 1024) is None  # within a quarter of 184
    assert next_level({64: 90.0}, 50, 1024) is None


def test_the_largest_level_held_is_below_the_first_over_the_limit():
    assert largest_held({64: 20.0, 160: 40.0, 256: 80.0}, 50) == 160
    # A level that happened to pass above one that failed does not count.
    assert largest_held({64: 20.0, 128: 70.0, 256: 45.0}, 50) == 64
    assert largest_held({64: 90.0}, 50) is None
    assert largest_held({64: 50.0, 32: 49.9}, 50) == 32


def test_a_reply_gives_its_id_and_content_deltas_on_the_wall_clock():
    frames = [(1.0, b'{"type":"response.created","sequence_number":0,"response":{"id":"resp_1"}}'),
              (2.0, b'{"type":"response.reasoning_text.delta","delta":"think"}'),
              (3.0, b'{"type":"response.output_text.delta","delta":"hi"}'),
              (4.0, b'{"type":"response.output_text.done","text":"hi"}')]
    assert delta_frames(frames, 100.0) == ("resp_1", [(102.0, "think"), (103.0, "hi")])


def test_the_follower_orders_batches_and_prefers_the_workers_first_emission_time():
    follower = BatchFollower()
    batch = {"kind": "tokens", "response_id": "r", "attempt": 0, "token_ids": [5]}
    follower.received = [(10.0, orjson.dumps({**batch, "batch_no": 1, "emitted_at": 9.5})),
                         (11.0, orjson.dumps({**batch, "batch_no": 0})),
                         (12.0, orjson.dumps({**batch, "batch_no": 1, "emitted_at": 9.5})),  # redelivered
                         (13.0, orjson.dumps({**batch, "batch_no": 2, "token_ids": []})),  # a keepalive
                         (14.0, orjson.dumps({**batch, "batch_no": 3, "token_ids": [6, 7],
                                              "first_emitted_at": 13.2, "emitted_at": 13.6}))]
    by_response, batches, stamped = follower.take()
    assert by_response == {"r": [Emission(11.0, [5], on_bus=11.0), Emission(9.5, [5], on_bus=10.0),
                                 Emission(13.2, [6, 7], on_bus=14.0)]}
    assert (batches, stamped) == (4, 3)
    assert follower.received == []


def test_the_follower_takes_each_batch_a_group_carries():
    follower = BatchFollower()

    def batch(rid: str, number: int) -> dict:
        return {"kind": "tokens", "response_id": rid, "attempt": 0, "batch_no": number, "token_ids": [number],
                "first_emitted_at": 20.0 + number}

    group = {"kind": "group", "v": 1, "batches": [{"headers": {}, "batch": batch("r", 1)},
                                                   {"headers": {}, "batch": batch("s", 0)}]}
    follower.received = [(20.5, orjson.dumps(batch("r", 0))), (21.5, orjson.dumps(group))]
    by_response, batches, stamped = follower.take()
    assert by_response == {"r": [Emission(20.0, [0], on_bus=20.5), Emission(21.0, [1], on_bus=21.5)],
                           "s": [Emission(20.0, [0], on_bus=21.5)]}
    assert (batches, stamped) == (3, 3)


def test_announcements_give_when_content_was_announced():
    def committed(response_id: str, *deltas: str) -> dict:
        events = [{"seq": i, "type": "response.output_text.delta", "payload": orjson.dumps({"delta": d}).decode()}
                  for i, d in enumerate(deltas)]
        return {"v": 1, "response_id": response_id, "events": events}

    def announced(*committed: dict) -> bytes:
        return orjson.dumps({"v": 1, "committed": list(committed)})

    follower = AnnouncementFollower()
    no_content = {"v": 1, "response_id": "r", "events": [{"seq": 3, "type": "response.output_item.added",
                                                           "payload": "{}"}]}
    follower.received = [(5.0, announced(committed("r", "ab", "c"), committed("s", "xyz"))),
                         (6.0, announced(no_content)), (7.0, announced(committed("r", "de")))]
    assert follower.take_announcements() == {"r": Announcements([5.0, 7.0], [3, 5]), "s": Announcements([5.0], [3])}


def test_each_delta_is_split_into_worker_parser_and_edge_stages():
    emissions = [Emission(1.0, [1], on_bus=1.002), Emission(2.0, [2], on_bus=2.004)]
    announced = Announcements([1.010, 2.020], [3, 5])
    stages = stage_latencies_ms(emissions, [3, 5], announced, [(1.015, "abc"), (2.050, "de"), (3.0, "beyond")])
    assert {stage: [round(v, 3) for v in values] for stage, values in stages.items()} == {
        "worker": [2.0, 4.0], "parser": [8.0, 16.0], "edge": [5.0, 30.0]}
