"""Stand-ins for a structured-output backend, grammar and reasoning parser,
so structured outputs run on the CPU without a tokenizer. They are
deterministic and state-dependent: a mask row reveals how many tokens its
grammar has accepted, so equal masks mean equal grammar histories, and the
reasoning parser reads the whole ``all_token_ids``, so a Request whose
tokens lag behind decides differently."""

from __future__ import annotations

from typing import Any

import torch

#: A token no grammar accepts.
REJECTED = 13
#: The token that ends reasoning, the second time it appears.
THINK_END = 8
#: Tokens a grammar accepts before it is complete (then it allows anything).
LENGTH = 6


class FakeGrammar:
    """Accepts anything but ``REJECTED``, up to ``LENGTH`` tokens."""

    def __init__(self) -> None:
        self.num_accepted = 0

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        for t in tokens:
            if self.is_terminated():
                return True  # xgrammar ignores tokens after the end
            if t == REJECTED:
                return False
            self.num_accepted += 1
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return tokens[: tokens.index(REJECTED)] if REJECTED in tokens else list(tokens)

    def rollback(self, num_tokens: int) -> None:
        self.num_accepted -= num_tokens

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        bitmask[batch_index].fill_(self.num_accepted + 1)

    def is_terminated(self) -> bool:
        return self.num_accepted >= LENGTH

    def reset(self) -> None:
        self.num_accepted = 0


class FakeBackend:
    """The manager's backend: only allocates the mask buffer here (grammars
    are handed to requests by the test, as compile results)."""

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        return torch.zeros((max_num_seqs, 2), dtype=torch.int32)


class FakeReasoner:
    """A legacy reasoning parser: reasoning ends at the second ``THINK_END``
    of the whole sequence."""

    def __init__(self, tokenizer: Any = None, **kwargs: Any) -> None:
        del tokenizer, kwargs

    def is_reasoning_end(self, input_ids: list[int]) -> bool:
        return list(input_ids).count(THINK_END) >= 2

    def is_reasoning_end_streaming(self, input_ids: list[int], delta_ids: list[int]) -> bool:
        return THINK_END in delta_ids and self.is_reasoning_end(input_ids)


def install(manager: Any, reasoning: bool) -> None:
    """Give a StructuredOutputManager the fake backend (and parser)."""
    manager.backend = FakeBackend()
    manager.tokenizer = None
    manager.reasoner_cls = FakeReasoner if reasoning else None
