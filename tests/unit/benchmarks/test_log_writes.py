import orjson

from steno.benchmarks.log_writes import Sizes, delta_payload, write_of


def test_a_delta_payload_is_about_the_size_asked_for():
    for size in (200, 450, 1000):
        payload = orjson.loads(delta_payload(7, size))
        assert payload["type"] == "response.output_text.delta" and payload["sequence_number"] == 7
        assert abs(len(delta_payload(7, size)) - size) <= 2


def test_each_shape_holds_what_its_name_says():
    sizes = Sizes(commits=1, responses_per_commit=1, events=3, payload_bytes=300, batches=2, batch_tokens=4)
    events, batches, both, ending = (write_of(shape, "resp_1", sizes) for shape in ("events", "batches", "both",
                                                                                      "ending"))
    assert (len(events.events), len(events.consumed), events.final_snapshot) == (3, 0, None)
    assert (len(batches.events), len(batches.consumed)) == (0, 2)
    assert [len(b.token_ids) for b in batches.consumed] == [4, 4]
    assert (len(both.events), len(both.consumed), both.final_snapshot) == (3, 2, None)
    assert ending.final_snapshot is not None and ending.final_snapshot["status"] == "completed"
    assert [e.seq for e in ending.events] == [1, 2, 3] and all(e.hash for e in ending.events)
