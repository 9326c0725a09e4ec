"""A group's body is spliced from batches already encoded: it must decode as the
``TokenBatchGroup`` the parser reads, each batch exactly as it was encoded alone."""

from steno.schemas.bus import TokenBatch, TokenBatchGroup
from steno.services.worker.batch_groups import Carried, group_body


def grouped(batch: TokenBatch, headers: dict[str, str]) -> tuple[bytes, bytes]:
    return Carried.of(headers).member_head, batch.model_dump_json(exclude_none=True).encode()


def test_a_spliced_group_decodes_to_the_batches_and_their_headers():
    batches = [TokenBatch(response_id="resp_a", attempt=0, batch_no=3, token_ids=[1, 2], emitted_at=1.5,
                          logprobs=[-0.25, -1.0]),
               TokenBatch(response_id="resp_b", attempt=1, batch_no=0, token_ids=[], resumed_after=7)]
    body = group_body([grouped(batches[0], {"Steno-Tenant": "t\u00e9"}), grouped(batches[1], {})])
    group = TokenBatchGroup.model_validate_json(body)
    assert [member.batch for member in group.batches] == batches
    assert [member.headers for member in group.batches] == [{"Steno-Tenant": "t\u00e9"}, {}]
