"""Incremental detokenization that never splits a UTF-8 character.

Each token gets the text it completes: a token ending inside a multi-byte character gets ""
and the next token carries the whole character. A few prompt tokens seed the window so that
tokenizers that strip a leading space (SentencePiece) decode mid-stream pieces correctly.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, seed_ids: list[int] | tuple[int, ...] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.ids: list[int] = list(seed_ids)[-6:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def _piece(self, ids: list[int], prefix_offset: int, read_offset: int) -> tuple[str, bool]:
        prefix_text = self._decode(ids[prefix_offset:read_offset])
        new_text = self._decode(ids[prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            return new_text[len(prefix_text):], True
        return "", False

    def push(self, token_id: int) -> str:
        """Commit one token; return the text it completes."""
        self.ids.append(int(token_id))
        piece, advanced = self._piece(self.ids, self.prefix_offset, self.read_offset)
        if advanced:
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return piece

    def peek(self, token_ids: list[int]) -> list[str]:
        """Pieces the tokens WOULD produce after the committed text (for rejected drafts)."""
        ids, prefix_offset, read_offset = list(self.ids), self.prefix_offset, self.read_offset
        pieces = []
        for token in token_ids:
            ids.append(int(token))
            piece, advanced = self._piece(ids, prefix_offset, read_offset)
            if advanced:
                prefix_offset, read_offset = read_offset, len(ids)
            pieces.append(piece)
        return pieces

    def flush(self) -> str:
        """Text of a trailing incomplete character, if generation ended inside one."""
        if self.read_offset >= len(self.ids):
            return ""
        tail = self._decode(self.ids[self.prefix_offset:])[len(self._decode(self.ids[self.prefix_offset:self.read_offset])):]
        self.prefix_offset = self.read_offset = len(self.ids)
        return tail
