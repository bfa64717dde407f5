"""kvplan: capacity planning and simulation for the KV cache of LLM serving."""

__version__ = "0.1.0"
