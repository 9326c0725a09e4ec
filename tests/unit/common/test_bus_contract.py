"""The bus contract (docs/asyncapi.json) against the models and names the services use."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from steno.schemas import bus as bus_messages
from steno.services.cli import main
from steno.services.common.bus import Names
from steno.services.common.bus_contract import (
    REGENERATE,
    BusMessages,
    asyncapi_document,
    channels_of,
    differences,
    render,
    template_pattern,
)

COMMITTED = Path(__file__).parents[3] / "docs" / "asyncapi.json"


def drift_from_committed(document: dict[str, Any]) -> list[str]:
    """What CI reports: where the committed document differs from ``document``."""
    return list(differences(json.loads(COMMITTED.read_text()), document))


def test_the_committed_document_is_the_one_the_models_make():
    drift = drift_from_committed(asyncapi_document())
    assert not drift, f"docs/asyncapi.json is out of date; run `{REGENERATE}`:\n" + "\n".join(drift[:20])


def test_a_message_model_changed_without_regenerating_the_document_fails_the_check():
    class CancelOrder(bus_messages.CancelOrder):
        reason: str

    drift = drift_from_committed(asyncapi_document(messages=BusMessages(cancel_order=CancelOrder)))
    assert "/components/schemas/CancelOrder/properties/reason: added" in drift
    assert '/components/schemas/CancelOrder/required: ["response_id"] -> ["response_id", "reason"]' in drift


def test_a_changed_model_nested_in_a_message_changes_the_document():
    class TokenBatch(bus_messages.TokenBatch):
        priority: int

    # Every message that holds a TokenBatch holds the changed one: two models of one name
    # would leave which of them the document describes to the order they are met in.
    class GroupedBatch(bus_messages.GroupedBatch):
        batch: TokenBatch

    class TokenBatchGroup(bus_messages.TokenBatchGroup):
        batches: list[GroupedBatch]

    def token_stream(batch: type[bus_messages.TokenBatch]) -> Any:
        return Annotated[batch | bus_messages.GenerationEnded, Field(discriminator="kind")]

    assert drift_from_committed(asyncapi_document(messages=BusMessages(token_stream=token_stream(
        bus_messages.TokenBatch)))) == []
    drift = drift_from_committed(asyncapi_document(messages=BusMessages(token_stream=token_stream(TokenBatch),
                                                                        token_batch_group=TokenBatchGroup)))
    assert "/components/schemas/TokenBatch/properties/priority: added" in drift


def test_the_command_prints_the_document(capsys):
    main(["asyncapi"])
    assert capsys.readouterr().out == COMMITTED.read_text()
    main(["asyncapi", "--namespace", "prod"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["channels"]["generation-work"]["address"] == "prod.gen.{model}"


NAMES = Names("steno", token_partitions=16)
RESPONSE_ID = "resp_0123abcd" + "0" * 40


@pytest.mark.parametrize("subject", [
    NAMES.gen_subject("gpt-oss-20b"),
    NAMES.gen_subject("org/model.v2"),
    NAMES.gen_affinity_subject("gpt-oss-20b", 7),
    NAMES.tokens_subject(RESPONSE_ID),
    NAMES.events_subject("0123abcd"),
    f"$KV.{NAMES.followers_bucket}.{RESPONSE_ID}.0123abcd",
    f"$KV.{NAMES.cancel_bucket}.{RESPONSE_ID}",
    f"$KV.{NAMES.takeovers_bucket}.{RESPONSE_ID}",
    f"$KV.{NAMES.workers_bucket}.gpt-oss-20b",
    f"$KV.{NAMES.parser_leases_bucket}.p3",
    f"$KV.{NAMES.parsers_bucket}.host.example-123-a1b2c3",
    f"$KV.{NAMES.affinity_leases_bucket}.gpt-oss-20b.p5",
    f"$KV.{NAMES.affinity_holders_bucket}.gpt-oss-20b.host-123-a1b2c3",
    f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{NAMES.gen_stream}.{NAMES.affinity_consumer('gpt-oss-20b', 2)}",
])
def test_every_subject_the_services_use_is_exactly_one_channel(subject):
    assert len(channels_of(asyncapi_document(), subject)) == 1, subject


def receivers(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [operation["x-steno"] for operation in document["operations"].values() if operation["action"] == "receive"]


def test_every_stream_consumer_bucket_and_store_is_documented():
    document = asyncapi_document()
    facts = [channel["x-steno"] for channel in document["channels"].values()]
    assert {fact["stream"]["name"] for fact in facts if "stream" in fact} == {
        NAMES.gen_stream, NAMES.tokens_stream, NAMES.exhausted_work_stream}
    assert {fact["bucket"]["name"] for fact in facts if "bucket" in fact} == set(NAMES.buckets)
    assert set(document["x-steno-object-stores"]) == {NAMES.requests_store, NAMES.model_files_store}
    consumers = [template_pattern(receiver["consumer"]) for receiver in receivers(document)
                 if receiver.get("consumer", "(ephemeral)") != "(ephemeral)"]
    for durable in (NAMES.worker_consumer("gpt-oss-20b"), NAMES.affinity_consumer("gpt-oss-20b", 2),
                    NAMES.parser_consumer(11), NAMES.exhausted_work_consumer):
        assert any(consumer.fullmatch(durable) for consumer in consumers), durable
    filters = [template_pattern(receiver["subject"]) for receiver in receivers(document)]
    for subscribed in (NAMES.tokens_partition_filter(11), NAMES.events_subject("0123abcd"),
                       f"$KV.{NAMES.followers_bucket}.{RESPONSE_ID}.0123abcd"):
        assert any(pattern.fullmatch(subscribed) for pattern in filters), subscribed


def test_every_reference_resolves_and_every_parameter_is_described():
    document = asyncapi_document()

    def references(node: Any) -> list[str]:
        if isinstance(node, dict):
            own = [node["$ref"]] if "$ref" in node else []
            return own + [ref for value in node.values() for ref in references(value)]
        if isinstance(node, list):
            return [ref for value in node for ref in references(value)]
        return []

    for ref in references(document):
        target: Any = document
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
    for channel in document["channels"].values():
        named = set(re.findall(r"{(\w+)}", channel["address"]))
        assert named == set(channel.get("parameters", {})), channel["address"]
    assert render(document) == render(json.loads(render(document)))
