"""The LlamaCpp backend: programs on llama.cpp itself, the official runtime (the `llamacpp` extra)."""

from .program import LlamaCppProgram

__all__ = ["LlamaCppProgram"]
