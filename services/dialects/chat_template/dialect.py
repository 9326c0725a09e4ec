"""The chat-template dialect: renders through the model's template and tokenizer, reads
its output with the family's reasoning and tool-call parsers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import ChatTemplateFiles
from steno.schemas.responses import ParseContext
from steno.services.dialects.base import (
    CompletionMessage,
    InvalidInput,
    PromptFacts,
    RenderedPrompt,
    StructuredOutputScope,
)
from steno.services.dialects.chat_template import grammar, simulation
from steno.services.dialects.chat_template.families import FAMILIES
from steno.services.dialects.chat_template.render import build_chat
from steno.services.dialects.chat_template.splitter import ChatTemplateSplitter
from steno.services.dialects.chat_template.template import TemplateError, render_chat, supported_roles
from steno.services.dialects.chat_template.vocabulary import IncrementalDecoder, PromptEncoder, TokenTexts

# The tool-call format whose arguments are text, typed by the offered parameters.
TYPED_BY_PARAMETERS = "qwen3_coder"


class ChatTemplateDialect:
    name = "chat_template"

    def __init__(self, files: ChatTemplateFiles) -> None:
        self.model_files = files
        self.files = files.digest()
        self.tokenizer = Tokenizer.from_str(files.tokenizer)
        self._family = FAMILIES[files.family]
        self._roles = supported_roles(files.chat_template, files.template_tokens)
        stop_ids = (self.tokenizer.token_to_id(token) for token in files.stop_tokens)
        self.stop_token_ids = sorted({token_id for token_id in stop_ids if token_id is not None})
        self._stop_set = frozenset(self.stop_token_ids)
        self._token_texts = TokenTexts(self.tokenizer, self._stop_set)
        self._prompts = PromptEncoder(self.tokenizer)

    def render_text(self, request: CreateResponseRequest, created_at: int,
                    history: Sequence[dict[str, Any]] = ()) -> tuple[str, ParseContext]:
        chat = build_chat(request, history, self._roles)
        effort = request.reasoning.effort if request.reasoning else None
        try:
            text = render_chat(self.model_files.chat_template, chat.messages, tools=chat.tools or None,
                               add_generation_prompt=True, special_tokens=self.model_files.template_tokens,
                               # The date templates print (Llama 3's), from the response, so the
                               # prompt is the same whenever it is rendered.
                               date_string=dt.datetime.fromtimestamp(created_at, dt.UTC).strftime("%d %b %Y"),
                               **self._family.template_kwargs(effort))
        except TemplateError as exc:
            raise InvalidInput(f"The model's chat template refused this conversation: {exc}", "input") from exc
        tags = self.model_files.reasoning_tags
        context = chat.offered.parse_context(self.name, 0).model_copy(update={
            "dialect_files": self.files,
            "reasoning_open": tags is not None and text.rstrip().endswith(tags[0]),
            "parameter_types": chat.parameter_types if self.model_files.tool_call_format == TYPED_BY_PARAMETERS
            else {},
        })
        return text, context

    def render(
        self, request: CreateResponseRequest, created_at: int, history: Sequence[dict[str, Any]] = (),
        reuse_scope: str = "",
    ) -> RenderedPrompt:
        text, context = self.render_text(request, created_at, history)
        token_ids = self._prompts.encode(text, reuse_scope)
        context = context.model_copy(update={"prompt_tokens": len(token_ids)})
        return RenderedPrompt(token_ids, context, list(self.stop_token_ids))

    def splitter(self, context: ParseContext) -> ChatTemplateSplitter:
        return ChatTemplateSplitter(IncrementalDecoder(self.tokenizer, self._token_texts), self._stop_set, context,
                                    self.model_files.reasoning_tags, self.model_files.tool_call_format)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def read_prompt(self, prompt_token_ids: Sequence[int]) -> PromptFacts:
        text = self.tokenizer.decode(list(prompt_token_ids), skip_special_tokens=False)
        return simulation.read_prompt(self.model_files.family, text, self.model_files.reasoning_tags)

    def write_completion(self, messages: Sequence[CompletionMessage]) -> list[int]:
        text = simulation.write_completion(messages, self.model_files.reasoning_tags,
                                           self.model_files.tool_call_format, self.model_files.stop_tokens[0])
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def answer_grammar(
        self, json_schema: dict[str, Any], scope: StructuredOutputScope, max_whitespace: int | None
    ) -> dict[str, Any]:
        return grammar.answer_grammar(json_schema, scope, max_whitespace, self.model_files.reasoning_tags)
