"""Incremental detokenization and stop strings."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Text of a request's output tokens, grown token by token. A trailing
    incomplete UTF-8 sequence (decoded as U+FFFD) is held back until the
    next token completes it."""

    def __init__(self, tokenizer: Any | None, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""

    def add(self, output_token_ids: list[int], final: bool = False) -> str:
        """Return the new text after the output grew to ``output_token_ids``
        (``final``: the request ended, so nothing is held back)."""
        if self.tokenizer is None:
            return ""
        full = self.tokenizer.decode(output_token_ids, skip_special_tokens=self.skip_special_tokens)
        if full.endswith("\ufffd") and not final:
            return ""
        delta = full[len(self.text) :] if full.startswith(self.text) else full
        self.text = full
        return delta


def find_stop(text: str, new_len: int, stops: list[str]) -> tuple[str, int] | None:
    """The first stop string that ends in the last ``new_len`` characters
    (or spans into them): (the string, where it starts)."""
    best = None
    for s in stops:
        start = text.find(s, max(0, len(text) - new_len - len(s) + 1))
        if start >= 0 and (best is None or start < best[1]):
            best = (s, start)
    return best
