"""The audit pages, served by the API process outside OpenAI's namespace:

- ``GET /audit/responses/{id}``: the response, its verification, its event timeline
  with the time each event was stored;
- ``GET /audit/responses/{id}/transcript``: its ``previous_response_id`` chain, turn by turn;
- ``GET /audit/responses/{id}/replay?format=sse|jsonl``: its stream as clients received it;
- ``GET /audit/conversations/{id}``: a conversation's responses, verified, and its turns.

Server-rendered HTML, no script, every value escaped (and a content security policy
that runs none anyway). Authenticated with the API keys: ``Authorization: Bearer KEY``,
or HTTP Basic with the key as the password, so that a browser can ask for it. Scoped
to the key's tenant: another tenant's response or conversation is the same 404 as a
missing one."""

from __future__ import annotations

import asyncio
import base64
import html
import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from steno.services.audit import replay as replays
from steno.services.audit.records import AuditRecords, StoredEvent, StoredResponse, Turn
from steno.services.audit.resources import PageResources
from steno.services.audit.transcript import describe
from steno.services.audit.verify import Verification, check, reparse_stored, verify_responses
from steno.services.common.config import Settings


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        yield
    finally:
        resources: PageResources | None = getattr(app.state, "audit", None)
        if resources is not None:
            await resources.close()


router = APIRouter(prefix="/audit", include_in_schema=False, lifespan=_lifespan)
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_HEADERS = {
    # Nothing on these pages runs or loads: a payload that holds markup stays text.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _resources(request: Request) -> PageResources:
    state = request.app.state
    resources: PageResources | None = getattr(state, "audit", None)
    if resources is None:
        # The API process's own settings (``steno api`` reads them from the same place).
        resources = state.audit = PageResources(Settings.from_env())
    return resources


async def _tenant(request: Request) -> str | None:
    """The caller's tenant, by the API's own authenticator; None when the key is
    missing or unknown."""
    authorization = request.headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "basic":
        try:
            credentials = base64.b64decode(value.strip(), validate=True).decode()
        except ValueError:
            credentials = ""
        authorization = "Bearer " + credentials.partition(":")[2]
    try:
        tenant: str = await request.app.state.api.authenticate(authorization)
    except Exception as exc:
        if getattr(exc, "status", None) == 401:
            return None
        raise
    return tenant


def _page(title: str, body: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    document = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
                f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_STYLE}</style></head>'
                f'<body>{body}</body></html>')
    return Response(document, status_code=status, media_type="text/html; charset=utf-8",
                    headers={**_HEADERS, **(headers or {})})


def _unauthorized() -> Response:
    return _page("Steno audit: sign in", "<main><h1>Sign in</h1><p>These pages take a Steno API key: "
                 "<code>Authorization: Bearer KEY</code>, or your browser's sign-in with the key as the "
                 "password.</p></main>", 401, {"WWW-Authenticate": 'Basic realm="Steno audit", charset="UTF-8"'})


def _not_found(what: str) -> Response:
    return _page("Steno audit: not found", f"<main><h1>Not found</h1><p>No {_e(what)} here.</p></main>", 404)


@router.get("/responses/{response_id}")
async def response_page(response_id: str, request: Request) -> Response:
    tenant = await _tenant(request)
    if tenant is None:
        return _unauthorized()
    resources = _resources(request)
    pool = await resources.pool()
    stored = await AuditRecords(pool).response(response_id, tenant) if _ID.fullmatch(response_id) else None
    if stored is None:
        return _not_found("response with that id")
    reparsed = await reparse_stored(pool, stored, resources.model_files)
    verification = await asyncio.to_thread(check, stored, reparsed)
    return _page(f"Audit: {response_id}", _response_body(stored, verification))


@router.get("/responses/{response_id}/transcript")
async def transcript_page(response_id: str, request: Request) -> Response:
    tenant = await _tenant(request)
    if tenant is None:
        return _unauthorized()
    pool = await _resources(request).pool()
    turns = await AuditRecords(pool).chain(response_id, tenant) if _ID.fullmatch(response_id) else None
    if turns is None:
        return _not_found("response with that id")
    count = len(turns)
    body = (f"<header><h1>Transcript</h1><p>The <code>previous_response_id</code> chain ending at "
            f"{_response_link(response_id)}: {count} turn{'s' * (count != 1)}.</p></header>"
            f"<main>{_turns(turns)}</main>")
    return _page(f"Transcript: {response_id}", body)


@router.get("/responses/{response_id}/replay")
async def replay_page(response_id: str, request: Request, format: str = "sse") -> Response:
    tenant = await _tenant(request)
    if tenant is None:
        return _unauthorized()
    if format not in replays.FORMATS:
        return _page("Steno audit", f"<main><p>format is one of {_e(', '.join(replays.FORMATS))}.</p></main>", 400)
    pool = await _resources(request).pool()
    events = await AuditRecords(pool).events(response_id, tenant) if _ID.fullmatch(response_id) else None
    if events is None:
        return _not_found("response with that id")
    # Shown as text, never run as a stream.
    return Response(replays.replay(events, format), media_type="text/plain; charset=utf-8", headers=_HEADERS)


@router.get("/conversations/{conversation_id}")
async def conversation_page(conversation_id: str, request: Request) -> Response:
    tenant = await _tenant(request)
    if tenant is None:
        return _unauthorized()
    resources = _resources(request)
    pool = await resources.pool()
    conversation = await AuditRecords(pool).conversation(conversation_id, tenant) \
        if _ID.fullmatch(conversation_id) else None
    if conversation is None:
        return _not_found("conversation with that id")
    verifications = await verify_responses(pool, conversation.response_ids, tenant_id=tenant,
                                           model_files=resources.model_files)
    intact = sum(v.ok for v in verifications)
    rows = "".join(
        f'<tr class="{"ok" if v.ok else "bad"}"><td>{_response_link(v.response_id)}</td>'
        f'<td>{"intact" if v.ok else "FAILED"}</td><td>{_e(v.summary())}</td></tr>' for v in verifications)
    metadata = "".join(f"<dt>{_e(key)}</dt><dd>{_e(value)}</dd>" for key, value in conversation.metadata.items())
    verdict = "ok" if intact == len(verifications) else "bad"
    body = (
        f"<header><h1>Conversation <code>{_e(conversation.conversation_id)}</code></h1>"
        f"<p>created {_e(replays.stored_time(conversation.created_at))}</p></header><main>"
        f'<section class="verification {verdict}"><h2>Verification</h2>'
        f'<p class="verdict">{intact} of {len(verifications)} responses intact</p>'
        f"<table><thead><tr><th>response</th><th>verdict</th><th>summary</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
        + (f"<section><h2>Metadata</h2><dl>{metadata}</dl></section>" if metadata else "")
        + f"<section><h2>Transcript</h2>{_turns(conversation.turns)}</section></main>"
    )
    return _page(f"Audit: {conversation_id}", body)


def _response_body(stored: StoredResponse, verification: Verification) -> str:
    rid = stored.response_id
    facts = [("model", _e(stored.model)), ("status", _e(stored.status)),
             ("created", _e(replays.stored_time(stored.created_at)))]
    if stored.previous_response_id:
        facts.append(("previous response", _response_link(stored.previous_response_id)))
    if stored.conversation_id:
        conversation = _e(stored.conversation_id)
        facts.append(("conversation", f'<a href="/audit/conversations/{conversation}"><code>{conversation}</code></a>'))
    if verification.chained_to is not None:
        target, seq = verification.chained_to
        facts.append(("first event chained to", f"{_response_link(target)} seq {seq}"))
    facts_html = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    bad_seqs = {finding.seq for finding in verification.findings}
    first = verification.first
    verdict = "Intact" if verification.ok else \
        f"FAILED at seq {first.seq}" if first is not None and first.seq is not None else "FAILED"
    findings = "".join(f"<li>{_e(finding.describe())}</li>" for finding in sorted(
        verification.findings, key=lambda f: (f.seq is None, f.seq or 0)))
    notes = "".join(f"<li>{_e(note)}</li>" for note in verification.notes)
    return (
        f"<header><h1>Response <code>{_e(rid)}</code></h1><nav>"
        f'<a href="/audit/responses/{_e(rid)}/transcript">Transcript</a> · '
        f'<a href="/audit/responses/{_e(rid)}/replay">Replay (SSE)</a> · '
        f'<a href="/audit/responses/{_e(rid)}/replay?format=jsonl">Replay (JSON lines)</a></nav></header><main>'
        f'<section class="verification {"ok" if verification.ok else "bad"}"><h2>Verification</h2>'
        f'<p class="verdict">{_e(verdict)}</p><p class="summary">{_e(verification.summary())}</p>'
        + (f'<ul class="findings">{findings}</ul>' if findings else "")
        + (f'<ul class="notes">{notes}</ul>' if notes else "")
        + f"</section><section><h2>Response</h2><dl>{facts_html}</dl></section>"
        f"<section><h2>Event timeline</h2><p>{len(stored.events)} events, each with the time it was stored.</p>"
        f'<table class="timeline"><thead><tr><th>seq</th><th>stored at</th><th>type</th><th>hash</th>'
        f"<th>content</th></tr></thead><tbody>{_timeline(stored.events, bad_seqs)}</tbody></table></section></main>"
    )


def _timeline(events: Iterable[StoredEvent], bad: set[int | None]) -> str:
    rows = []
    for event in events:
        digest = event.hash.hex() if event.hash is not None else ""
        rows.append(
            f'<tr id="seq-{event.seq}" class="{"bad" if event.seq in bad else ""}"><td>{event.seq}</td>'
            f"<td>{_e(replays.stored_time(event.stored_at))}</td><td><code>{_e(event.type)}</code></td>"
            f'<td><code title="{_e(digest)}">{_e(digest[:16])}</code></td>'
            f"<td>{_e(_gist(event))}<details><summary>payload</summary><pre>{_e(event.payload)}</pre></details></td>"
            "</tr>")
    return "".join(rows)


def _gist(event: StoredEvent) -> str:
    """What an event says, in a line."""
    try:
        body: Any = orjson.loads(event.payload)
    except orjson.JSONDecodeError:
        return "(not JSON)"
    if not isinstance(body, dict):
        return ""
    if "delta" in body:
        return str(body["delta"])
    if isinstance(body.get("response"), dict):
        return f"status {body['response'].get('status')}"
    if isinstance(body.get("item"), dict):
        view = describe(body["item"])
        return f"{view.title}: {view.text}" if view.text else view.title
    for field in ("text", "arguments", "input", "message"):
        if isinstance(body.get(field), str):
            return str(body[field])
    return ""


def _turns(turns: list[Turn]) -> str:
    parts = []
    for number, turn in enumerate(turns, 1):
        if turn.response_id is None:
            head = f"<h3>Turn {number}: items added to the conversation</h3>"
        else:
            facts = [f"model <code>{_e(turn.model)}</code>", _e(turn.status)]
            if turn.created_at is not None:
                facts.append(f"created {_e(replays.stored_time(turn.created_at))}")
            head = f"<h3>Turn {number}: {_response_link(turn.response_id)}</h3><p>{' · '.join(facts)}</p>"
        instructions = ""
        if turn.instructions:
            text = turn.instructions if isinstance(turn.instructions, str) else orjson.dumps(turn.instructions).decode()
            instructions = (f'<div class="item instructions"><div class="title">instructions</div>'
                            f"<pre>{_e(text)}</pre></div>")
        output = f"<h4>Output</h4>{_items(turn.output) or '<p>(none yet)</p>'}" if turn.response_id else ""
        parts.append(f'<article class="turn">{head}{instructions}<h4>Input</h4>{_items(turn.input) or "<p>(none)</p>"}'
                     f"{output}</article>")
    return "".join(parts)


def _items(items: list[dict[str, Any]]) -> str:
    rendered = []
    for item in items:
        view = describe(item)
        rendered.append(f'<div class="item item-{_e(view.kind)}"><div class="title">{_e(view.title)}</div>'
                        f"<pre>{_e(view.text)}</pre></div>")
    return "".join(rendered)


def _response_link(response_id: str) -> str:
    escaped = _e(response_id)
    return f'<a href="/audit/responses/{escaped}"><code>{escaped}</code></a>'


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1b1f24;background:#fff}
header,main{max-width:72rem;margin:0 auto;padding:0.5rem 1.5rem}
header{border-bottom:1px solid #d0d7de}h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:1.5rem}
code,pre{font-family:ui-monospace,monospace;font-size:0.85rem}
pre{white-space:pre-wrap;word-break:break-word;margin:0.2rem 0}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #eaeef2;padding:0.3rem 0.5rem;text-align:left;
vertical-align:top}tr.bad td{background:#ffebe9}.timeline td:nth-child(2){white-space:nowrap}
.verification{padding:0.5rem 1rem;border-radius:6px;border:1px solid}
.verification.ok{background:#dafbe1;border-color:#4ac26b}
.verification.bad{background:#ffebe9;border-color:#ff8182}.verdict{font-weight:600;font-size:1.1rem}
dl{display:grid;grid-template-columns:max-content 1fr;gap:0.2rem 1rem}dt{color:#57606a}dd{margin:0}
.turn{border:1px solid #d0d7de;border-radius:6px;padding:0.5rem 1rem;margin:1rem 0}
.item{border-left:3px solid #8c959f;padding-left:0.6rem;margin:0.4rem 0}.item .title{font-weight:600}
.item-reasoning{border-color:#bf8700}.item-call{border-color:#0969da}.item-output{border-color:#1a7f37}
"""
