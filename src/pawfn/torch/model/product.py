"""What every base or LoRA matrix offers the passes, whatever arithmetic made it (`Product`).

A pass decides once whether its rows must come out as if each were computed alone (a row-exact decode step, the
official runtime's every call), and then calls `rows`/`accumulate_rows` or `__call__`/`accumulate` throughout:
no product is told per call."""

from __future__ import annotations

from typing import Protocol, TypeVar

import torch

__all__ = ["Product", "Storage", "StoredProduct"]

Kept = TypeVar("Kept", covariant=True)


class Product(Protocol):
    """`x @ W.T` for one `[out, in]` matrix (or several joined by rows), as its arithmetic multiplies it."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x` [n, in] times the matrix as one call of n rows (a kernel may round by n): [n, out]."""
        ...

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """`self(x)` with every output row bit-identical to that row multiplied alone."""
        ...

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """A decode step's product where its rows need not be exact: `self(x)`, or `rows` where that costs no more."""
        ...

    def accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self(x)` in place (a LoRA side path's second product)."""
        ...

    def accumulate_rows(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self.rows(x)` in place."""
        ...


class StoredProduct(Product, Protocol):
    """A matrix kept in its GGUF file's type (F32/F16 values or quantized blocks)."""

    def all_finite(self) -> bool:
        """No NaN or infinity among its values or block scales."""
        ...


class Storage(Protocol[Kept]):
    """How a loader keeps a base's matrices or a program's side paths; the arithmetic says which (`Arithmetic.keep`)."""

    def floats(self) -> Kept:
        """As float matrices, a fused group's joined (torch's arithmetic)."""
        ...

    def as_stored(self) -> Kept:
        """Each in its file's type where the arithmetic multiplies it so (`Arithmetic.stored_matrix`), biases after
        the side paths (llama.cpp's graph)."""
        ...
