"""labkit: price speculative decoding on local LLM engines, with receipts."""

__version__ = "0.1.0"
