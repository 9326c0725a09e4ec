"""The baseline: the same engine streamed straight to SSE from one process, with no bus
and no database, the way engine-embedded servers serve Responses. It renders the prompt,
runs the simulator and folds its tokens through Steno's own pure parser, so the only
difference from Steno is the pipeline (NATS, Postgres, separate processes).

    python -m steno.benchmarks.baseline --port 8190 [--sim-tokens-per-s 0] [--sim-answer-tokens N]
        [--record-emissions]

With ``--record-emissions`` it keeps, per response, each batch's tokens and when the
engine emitted them, and hands them out once at ``GET /emissions/{response_id}``: the
``steady`` scenario measures each delta's arrival against them, as it does Steno's
against the batches on the bus.
"""

from __future__ import annotations

import argparse
import time
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import GenerationEnded, SamplingParams, TokenBatch
from steno.schemas.ids import new_response_id
from steno.schemas.responses import ParseContext
from steno.services.api.response_plan import plan_response
from steno.services.common.runtime import tune_garbage_collector
from steno.services.dialects import DEFAULT_DIALECT, dialect_named
from steno.services.edge import EventStreamResponse, frame
from steno.services.parser.response_state import ResponseState
from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming


def create_app(timing: SimulatorTiming, answer_tokens: int = 0, record_emissions: bool = False) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        tune_garbage_collector()  # as Steno's services do
        yield

    app = FastAPI(lifespan=lifespan)
    dialect = dialect_named(DEFAULT_DIALECT)
    engine = SimulatorEngine(dialect, timing, answer_tokens=answer_tokens)
    # response id -> [(emitted_at, token_ids), ...], while --record-emissions.
    emissions: dict[str, list[tuple[float, list[int]]]] = {}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/emissions/{response_id}")
    async def emitted(response_id: str) -> list[tuple[float, list[int]]]:
        return emissions.pop(response_id, [])

    @app.post("/v1/responses")
    async def create(body: CreateResponseRequest) -> EventStreamResponse:
        response_id = new_response_id()
        created_at = int(time.time())
        plan = plan_response(body, response_id, "baseline", created_at, dialect.render(body, created_at))
        state = ResponseState(response_id, plan.record.base_snapshot,
                              ParseContext.model_validate(plan.record.parse_context))
        prompt = plan.generation.prompt_token_ids

        async def frames():
            yield frame(plan.first_events[0]), False
            batch_no, produced = 0, 0
            sampling: SamplingParams = plan.generation.sampling
            emitted = emissions.setdefault(response_id, []) if record_emissions else None
            async for output in engine.generate(response_id, prompt, sampling):
                if output.token_ids:
                    if emitted is not None:
                        emitted.append((time.time(), output.token_ids))
                    batch = TokenBatch(response_id=response_id, attempt=0, batch_no=batch_no,
                                       token_ids=output.token_ids)
                    applied = state.apply_batch(batch)
                    for event in applied.events if applied else []:
                        yield frame(event), False
                    batch_no += 1
                    produced += len(output.token_ids)
                if output.finish_reason:
                    ended = GenerationEnded(response_id=response_id, attempt=0, batch_count=batch_no,
                                            finish_reason=output.finish_reason, prompt_tokens=len(prompt),
                                            output_tokens=produced)
                    finished = state.apply_end(ended)
                    for event in finished.events if finished else []:
                        yield frame(event), event.is_terminal

        return EventStreamResponse(frames())

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8190)
    parser.add_argument("--sim-tokens-per-s", type=float, default=0.0)
    parser.add_argument("--sim-chunk-tokens", type=int, default=16)
    parser.add_argument("--sim-answer-tokens", type=int, default=0)
    parser.add_argument("--record-emissions", action="store_true")
    args = parser.parse_args()
    timing = SimulatorTiming(tokens_per_s=args.sim_tokens_per_s, chunk_tokens=args.sim_chunk_tokens)
    uvicorn.run(create_app(timing, args.sim_answer_tokens, args.record_emissions), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
