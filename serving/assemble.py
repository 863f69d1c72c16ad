"""Assembling a non-streamed (chat) completion from decode's streamed chunks."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Assembler"]


def _merge_logprobs(acc: dict[str, Any] | None, part: Any) -> dict[str, Any] | None:
    """Concatenate streamed logprobs: chat ``{"content": [...]}``, completions
    ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` lists."""
    if not isinstance(part, dict):
        return acc
    acc = acc if acc is not None else {}
    for key, value in part.items():
        if isinstance(value, list):
            acc.setdefault(key, []).extend(value)
        elif key not in acc or acc[key] is None:
            acc[key] = value
    return acc


class Assembler:
    """Builds a non-streaming (chat) completion from decode's chunks: text or message content,
    reasoning content, tool calls (merged by index), logprobs, finish reason and final usage."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, Any] | None = None
        self.meta: dict[str, Any] = {}
        self.finish_reason: Any = None
        self.stop_reason: Any = None
        self.usage: Any = None

    def add(self, obj: dict) -> None:
        """Fold one parsed chunk in."""
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in obj and key not in self.meta:
                self.meta[key] = obj[key]
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if self.chat:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    self.text.append(delta["content"])
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    self.reasoning.append(reasoning)
                for call in delta.get("tool_calls") or ():
                    slot = self.tool_calls.setdefault(call.get("index", 0), {
                        "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                    if call.get("id"):
                        slot["id"] = call["id"]
                    fn = call.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
            elif choice.get("text"):
                self.text.append(choice["text"])
            self.logprobs = _merge_logprobs(self.logprobs, choice.get("logprobs"))
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")

    def result(self) -> dict[str, Any]:
        """The assembled ``chat.completion`` / ``text_completion``."""
        text = "".join(self.text)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.reasoning:
                message["reasoning_content"] = "".join(self.reasoning)
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[k] for k in sorted(self.tool_calls)]
            choice: dict[str, Any] = {"index": 0, "message": message}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            obj = "text_completion"
        choice.update(logprobs=self.logprobs, finish_reason=self.finish_reason, stop_reason=self.stop_reason)
        return {"id": self.meta.get("id", ""), "object": obj,
                "created": self.meta.get("created", int(time.time())),
                "model": self.meta.get("model", ""), "choices": [choice], "usage": self.usage}
