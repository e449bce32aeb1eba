"""The engine interface: a model over token ids, one sequence, a KV cache that can roll back.

The speculative loop needs exactly this: append rows to the cache and get their
logits (``decode``), forget a suffix (``rollback``), and say what it is (``describe``).
Everything else (drafting, acceptance, statistics) is engine-agnostic.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
from collections.abc import Sequence

import numpy as np

from labkit.errors import LabkitError


class EngineError(LabkitError):
    """The engine failed (decode error, crash, out of context)."""


class Engine(abc.ABC):
    """One model, one sequence. ``n_past`` tokens are in the cache at positions 0..n_past-1."""

    name: str = "base"
    n_past: int = 0
    n_ctx: int = 0
    n_vocab: int = 0
    kv_tokens: list[int]  # the tokens at cache positions 0..n_past-1 (engines keep it in step)

    # -- the three operations the loop is built on ---------------------------------
    @abc.abstractmethod
    def decode(self, tokens: Sequence[int], *, all_logits: bool = True) -> None:
        """Append ``tokens`` at positions n_past.. and compute their logits.

        ``all_logits=False`` computes only the last row (prefill); rows are then read
        with :meth:`logits` (row indices count the rows that have logits).
        Returns after the engine has synchronised, so a clock read right after is honest.
        """

    @abc.abstractmethod
    def rollback(self, n_past: int) -> None:
        """Drop cache positions >= ``n_past``."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """Provenance: engine build and flags, threads, context, model sha256, residency."""

    # -- token-level helpers ---------------------------------------------------------
    @abc.abstractmethod
    def logits(self, i: int = -1) -> np.ndarray:
        """Logits of output row ``i`` of the last decode: a float32 view, valid until the next decode."""

    @abc.abstractmethod
    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]: ...

    @abc.abstractmethod
    def detokenize(self, tokens: Sequence[int]) -> str: ...

    @abc.abstractmethod
    def is_eog(self, token: int) -> bool: ...

    @abc.abstractmethod
    def token_text(self, token: int) -> str:
        """The vocabulary entry for ``token`` (used to fingerprint vocabularies)."""

    def prefill(self, prompt: Sequence[int], *, keep: int = 0) -> int:
        """Put ``prompt`` in the cache with its last row's logits; returns the rows decoded.

        ``keep`` > 0 treats ``prompt[:keep]`` as a shared prefix (a few-shot preamble):
        kept if the cache already holds it, else computed on its own from position 0, and
        only the rest is decoded. Either way the prefix was computed by the same batches,
        so results are reproducible exactly (the lossless check replays them).
        """
        prompt = list(prompt)
        last = self._reused
        if last is not None and self._reuse:  # inside prompt_reuse(): the same prompt again?
            p, rows, row = last
            if p == prompt and self.n_past >= len(p) and self.kv_tokens[: len(p)] == p:
                self.rollback(len(p))
                self._serve_logits(row)
                return rows
        keep = max(0, min(keep, len(prompt) - 1))
        if keep and self.n_past >= keep and self.kv_tokens[:keep] == prompt[:keep]:
            self.rollback(keep)
        else:
            self.rollback(0)
            if keep:
                self.decode(prompt[:keep], all_logits=False)
        self.decode(prompt[keep:], all_logits=False)
        rows = len(prompt) - keep
        if self._reuse:
            self._reused = (prompt, rows, np.array(self.logits(-1), dtype=np.float32, copy=True))
        return rows

    # -- one prompt, several runs (the tool suite) -------------------------------------
    _reuse: bool = False
    _reused: tuple | None = None  # (prompt, rows, last-row logits) of the last prefill, while reusing

    @contextlib.contextmanager
    def prompt_reuse(self):
        """Within this block, prefilling the prompt the last prefill computed, while the cache
        still holds it, computes nothing: the cache is rolled back to the prompt's end and
        the last row's logits (copied when it was computed) are served again. The KV cells
        are the very ones computed then, so the runs that follow are bit for bit what a fresh
        prefill through the same batches gives (tests/test_qc.py checks it); the prefill
        returns the rows it was computed with, so a divergence replay redoes the same batches.
        Prefill *times* are then not measured: only for suites that measure behaviour.

        Yields whether reuse is on: not on engines that cannot serve saved logits, nor while
        decode hooks (the MTP drafter's) must see every decoded row.
        """
        before = self._reuse
        self._reuse, self._reused = self._can_reuse_prompts(), None
        try:
            yield self._reuse
        finally:
            self._reuse, self._reused = before, None

    def _can_reuse_prompts(self) -> bool:
        return False

    def _serve_logits(self, row: np.ndarray) -> None:
        """Make ``row`` the only output row, as if the last decode had just computed it."""
        raise NotImplementedError

    def argmax(self, i: int = -1) -> int:
        return int(np.argmax(self.logits(i)))

    def reset(self) -> None:
        self.rollback(0)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free native resources."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def check_fits(self, n_tokens: int, *, what: str = "prompt") -> None:
        """Refuse work that would overflow the context, before touching the cache."""
        if self.n_past + n_tokens > self.n_ctx:
            raise EngineError(
                f"{what} needs {self.n_past + n_tokens} positions but the context holds {self.n_ctx}",
                "shorten the prompt or max_tokens, or raise n_ctx in the recipe",
            )

    def tokens_containing(self, text: str) -> frozenset[int]:
        """Every token whose text contains ``text`` (e.g. the stop set for "\n"), cached."""
        cache = self.__dict__.setdefault("_contains_cache", {})
        if text not in cache:
            byte = "".join(f"<0x{b:02X}>" for b in text.encode()) if len(text.encode()) == 1 else None
            cache[text] = frozenset(
                t for t in range(self.n_vocab) if text in (s := self.token_text(t)) or (byte and s == byte)
            )
        return cache[text]

    def vocab_fingerprint(self, *, stride: int = 257) -> str:
        """A hash of the vocabulary size and a strided sample of token texts.

        Two models whose fingerprints differ cannot draft for each other.
        """
        h = hashlib.sha256(str(self.n_vocab).encode())
        if not getattr(self, "has_tokenizer", True):
            return "no-tokenizer-" + h.hexdigest()[:8]
        for t in range(0, self.n_vocab, stride):
            h.update(self.token_text(t).encode("utf-8", "replace"))
            h.update(b"\0")
        return h.hexdigest()[:16]


class VocabEngine(Engine):
    """An engine whose token helpers are its vocabulary object's (``self.tok``: llama.cpp's
    vocab, or the Hugging Face tokenizer MLX models ship with)."""

    tok: object

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        return self.tok.tokenize(text, add_bos=add_bos)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tok.detokenize(tokens)

    def is_eog(self, token: int) -> bool:
        return self.tok.is_eog(token)

    def token_text(self, token: int) -> str:
        return self.tok.token_text(token)
