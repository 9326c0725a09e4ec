"""``truncation: "auto"``: the oldest whole turns of a conversation left out until its
prompt fits the model's context (pure).

A turn starts at a user message and runs to the next one, so it takes its reasoning,
its tool calls and their outputs with it; a user message while a tool call is still
unanswered does not start one (the call and its output stay together). The last turn,
which the model answers, is never left out, nor are the request's system and
developer messages (its instructions)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from steno.services.dialects.tools import answered_call_id

_CALLS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output",
          "tool_search_call": "tool_search_output", "shell_call": "shell_call_output",
          "local_shell_call": "local_shell_call_output", "apply_patch_call": "apply_patch_call_output"}
_OUTPUTS = frozenset(_CALLS.values())


@dataclass(frozen=True)
class Conversation:
    """Earlier turns' items (``previous_response_id``) and the request's input items."""

    history: list[dict[str, Any]]
    input: list[dict[str, Any]]

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.history + self.input


def _is_user_message(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") == "user"


def _is_instruction(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type", "message") == "message" \
        and item.get("role") in ("system", "developer")


def turn_starts(items: Sequence[Any]) -> list[int]:
    """Where each turn after the first starts: cutting there leaves out whole turns."""
    starts = []
    open_calls: set[str] = set()
    for index, item in enumerate(items):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in _CALLS:
            open_calls.add(str(item.get("call_id")))
        elif kind in _OUTPUTS:
            open_calls.discard(str(answered_call_id(item)))
        elif index > 0 and _is_user_message(item) and not open_calls:
            starts.append(index)
    return starts


def without_oldest_turns(conversation: Conversation, turns: int) -> tuple[Conversation, int]:
    """The conversation with its ``turns`` oldest turns left out (0 < turns <= the
    number of turn starts), and how many items that leaves out."""
    starts = turn_starts(conversation.items)
    cut = starts[turns - 1]
    from_history = len(conversation.history)
    if cut <= from_history:
        kept = Conversation(conversation.history[cut:], conversation.input)
        return kept, cut
    dropped = conversation.input[: cut - from_history]
    instructions = [item for item in dropped if _is_instruction(item)]
    kept = Conversation([], instructions + conversation.input[cut - from_history:])
    return kept, cut - len(instructions)


class TurnSearch:
    """The fewest oldest turns to leave out for a prompt to fit, by bisection: leaving out
    fewer never makes a prompt shorter."""

    def __init__(self, conversation: Conversation) -> None:
        self._low, self._high = 1, len(turn_starts(conversation.items))
        self.fewest: int | None = None

    def next_try(self) -> int | None:
        """How many turns to try leaving out next; None once the search is over."""
        return (self._low + self._high) // 2 if self._low <= self._high else None

    def tried(self, turns: int, fits: bool) -> None:
        if fits:
            self.fewest, self._high = turns, turns - 1
        else:
            self._low = turns + 1
