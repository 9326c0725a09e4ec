import asyncio, json, pytest
from tests.vllm.test_vllm_engine import *

async def test_dbg(engine):
    sampling = [SamplingParams(max_tokens=400, seed=seed, stop_token_ids=stop_tokens(),
            structured_output=StructuredOutput(kind="json_schema", json_schema=SCHEMA)) for seed in range(8)]
    results = await asyncio.gather(*(collect(engine, f"json-final-{i}", s) for i, s in enumerate(sampling)))
    for outputs in results:
        toks = all_tokens(outputs)
        print(outputs[-1].finish_reason, toks[:6], repr(harmony_encoding().decode(toks)))
