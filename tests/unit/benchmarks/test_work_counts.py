from datetime import UTC, datetime

from steno.benchmarks.work_counts import Reading, per_request, printed, stack_streams
from steno.services.common.bus import Names

AT = datetime(2026, 12, 6, tzinfo=UTC)


def test_the_stack_s_streams_are_named_without_its_namespace():
    streams = stack_streams(Names(namespace="b1f2e3", token_partitions=4))
    assert streams["gen"] == "B1F2E3_GEN" and streams["tokens"] == "B1F2E3_TOKENS"
    assert streams["kv:parser_leases"] == "KV_b1f2e3_parser_leases"
    assert streams["objects:requests"] == "OBJ_b1f2e3_requests"
    assert not any("b1f2e3" in label for label in streams)


def test_what_moved_is_counted_per_request_and_the_log_per_response():
    before = Reading({"gen": 100, "tokens": 40, "kv:workers": 7}, wal_bytes=1_000_000, at=AT)
    after = Reading({"gen": 132, "tokens": 60, "kv:workers": 7, "kv:cancel": 2}, wal_bytes=1_640_000, at=AT)
    work = per_request(before, after, {"responses": 32, "events": 512, "token_batches": 80}, requests=32)
    # A stream that stored nothing is left out; one opened since counts from nothing.
    assert work["nats_messages"] == {"gen": 1.0, "kv:cancel": 0.06, "tokens": 0.62}
    assert work["wal_bytes"] == 20_000
    assert work["responses"] == 1.0
    assert work["events_per_response"] == 16.0 and work["token_batches_per_response"] == 2.5
    assert printed(work) == ("per request: token messages 0.62, WAL 20,000 bytes; "
                             "per response: token batches 2.5, events 16")


def test_a_level_without_requests_or_responses_counts_nothing_per_each():
    reading = Reading({"gen": 5}, wal_bytes=10, at=AT)
    assert per_request(reading, reading, {"responses": 0, "events": 0, "token_batches": 0}, requests=0) == {}
    work = per_request(reading, reading, {"responses": 0, "events": 0, "token_batches": 0}, requests=3)
    assert work["events_per_response"] == 0 and work["token_batches_per_response"] == 0
    assert work["nats_messages"] == {}
