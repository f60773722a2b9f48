from os import PathLike

import torch

def save_file(
    tensors: dict[str, torch.Tensor], filename: str | PathLike[str], metadata: dict[str, str] | None = None
) -> None: ...
