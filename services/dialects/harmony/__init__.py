"""Harmony, the format of OpenAI's gpt-oss models: the first dialect."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openai_harmony import HarmonyEncoding

from steno.schemas.api import CreateResponseRequest
from steno.schemas.responses import ParseContext
from steno.services.dialects.base import CompletionMessage, PromptFacts, RenderedPrompt, StructuredOutputScope
from steno.services.dialects.harmony import grammar, simulation
from steno.services.dialects.harmony.render import ConversationRenderer, build_conversation
from steno.services.dialects.harmony.splitter import HarmonyGrammar, HarmonyStreamSplitter


class HarmonyDialect:
    name = "harmony"
    files = None

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.encoding = encoding
        self._renderer = ConversationRenderer(encoding)
        self._grammar = HarmonyGrammar(encoding)
        self._stop_token_ids = sorted(encoding.stop_tokens_for_assistant_actions())

    def render(
        self, request: CreateResponseRequest, created_at: int, history: Sequence[dict[str, Any]] = (),
        reuse_scope: str = "",
    ) -> RenderedPrompt:
        conversation, offered = build_conversation(request, created_at, history)
        token_ids = self._renderer.render(conversation, reuse_scope)
        return RenderedPrompt(token_ids, offered.parse_context(self.name, len(token_ids)), list(self._stop_token_ids))

    def splitter(self, context: ParseContext) -> HarmonyStreamSplitter:
        return HarmonyStreamSplitter(self._grammar, context)

    def token_text(self, token_id: int) -> str:
        return self.encoding.decode([token_id])

    def read_prompt(self, prompt_token_ids: Sequence[int]) -> PromptFacts:
        return simulation.read_prompt(self.encoding, prompt_token_ids)

    def write_completion(self, messages: Sequence[CompletionMessage]) -> list[int]:
        return simulation.write_completion(self.encoding, messages)

    def answer_grammar(
        self, json_schema: dict[str, Any], scope: StructuredOutputScope, max_whitespace: int | None
    ) -> dict[str, Any]:
        return grammar.answer_grammar(json_schema, scope, max_whitespace)
