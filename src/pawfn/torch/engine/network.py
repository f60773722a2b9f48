"""The interpreter's network in plain torch: the forward pass over a prompt, the decode step over rows of any
programs, and the operations every family's blocks (embedding, block, final norm: the family's module) are written in:
products with LoRA side paths, norms, rotary embeddings, attention."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ...formats.adapter import LoraAdapter
from ...core.errors import BaseModelError
from ...core.options import Numerics, WeightDType
from ..model.arithmetic import Arithmetic
from ..model.attention import LLAMACPP_BATCH, StepSlots, llamacpp_batches
from ..model.families.base import Ops, RecurrentUpdate
from ..model.kvcache import KVCache, PrefixState
from ..weights.converted import ConvertedStore
from ..weights.loading import DeviceWeights, Product, load_device_weights
from ..weights.reader import BaseWeights
from ..weights.lora import DeviceAdapter, attach

__all__ = ["ImageEmbeddings", "StepRow", "TorchInterpreter"]


class ImageEmbeddings(NamedTuple):
    """An image in a prompt: its embeddings [rows * columns, hidden] in row-major order and its grid of tokens."""

    values: torch.Tensor
    rows: int
    columns: int


@dataclass(frozen=True)
class StepRow:
    """One sequence's next token in a decode step: where it goes and the program whose side paths it takes."""

    token: int
    position: int
    cache: KVCache
    adapter: DeviceAdapter


class TorchInterpreter:
    """The network: a base's weights on the device, its family's blocks and its arithmetic, composed into the passes
    that run them; read-only, shared by every program and KV slot."""

    def __init__(self, weights: DeviceWeights) -> None:
        self.weights = weights
        self.architecture = weights.architecture
        self.family = weights.family
        self.arithmetic: Arithmetic = weights.arithmetic
        self.device = weights.device
        self.dtype = weights.dtype

    @classmethod
    def load(
        cls,
        weights: BaseWeights,
        device: torch.device,
        dtype: torch.dtype,
        weight_dtype: WeightDType | None = None,
        numerics: Numerics = "native",
        store: ConvertedStore | None = None,
        progress: bool | None = False,
    ) -> TorchInterpreter:
        """`weights` read onto `device` for the arithmetic `numerics` names (`load_device_weights`), as a network."""
        return cls(load_device_weights(weights, device, dtype, progress, weight_dtype, store, numerics))

    def attach(self, adapter: LoraAdapter) -> DeviceAdapter:
        """Check `adapter` against these weights and move it to the device."""
        return attach(self.weights, adapter)

    def new_cache(self) -> KVCache:
        """An empty KV cache for this interpreter, in its arithmetic's KV dtype (llama.cpp's: f16, as the official runtime's)."""
        return KVCache(self.architecture, self.device, self.arithmetic.kv_dtype(self.dtype))

    @torch.inference_mode()
    def prefill_prefix(self, token_ids: list[int], adapter: DeviceAdapter, cache: KVCache) -> PrefixState:
        """Evaluate a program's prefix once and keep its KV (the adapter changes K and V, so it is per program)."""
        arch, n = self.architecture, len(token_ids)
        logits: torch.Tensor | None = None
        cache.begin(None)
        if n:
            logits = self.forward(token_ids, 0, cache, adapter).clone()
            keys = tuple(cache.keys[layer][:, :n].clone() for layer in range(arch.n_layers))
            values = tuple(cache.values[layer][:, :n].clone() for layer in range(arch.n_layers))
        else:
            empty = torch.empty((arch.n_kv_heads, 0, arch.head_dim), device=self.device, dtype=self.dtype)
            keys = values = tuple(empty for _ in range(arch.n_layers))
        # a sequence replaces its states rather than changing them, so the prefix keeps these tensors as they are
        return PrefixState(token_ids=tuple(token_ids), keys=keys, values=values, last_logits=logits, states=dict(cache.states))

    @torch.inference_mode()
    def forward(
        self, token_ids: list[int], start: int, cache: KVCache, adapter: DeviceAdapter, stop: Callable[[], bool] = lambda: False
    ) -> torch.Tensor:
        """Evaluate `token_ids` at positions `start...` into `cache`; returns the last position's logits [vocab]. One pass
        per llama.cpp batch (128 tokens, in its order), `stop` asked before each layer: true once the call is cancelled,
        it raises CancelledError there (late in a 24k-token prompt, within a fraction of a second on 2 cores)."""
        cache.reserve(cache.slot(start) + len(token_ids))  # once: growing pass by pass would copy the cache each time
        logits = torch.empty(0)
        for at in range(0, len(token_ids), LLAMACPP_BATCH):
            logits = self._pass(token_ids[at : at + LLAMACPP_BATCH], start + at, cache, adapter, stop)
        return logits

    def _pass(self, token_ids: list[int], start: int, cache: KVCache, adapter: DeviceAdapter, stop: Callable[[], bool]) -> torch.Tensor:
        positions = torch.arange(start, start + len(token_ids), device=self.device)
        ops = _ForwardPass(self.weights, adapter, cache, cache.slot(start), [len(token_ids)])
        hidden = self._layers(ops, self.family.embed(ops, torch.tensor(token_ids, device=self.device), positions), positions, stop)
        return ops.multiply(self.weights.matrices["output.weight"], self.family.final_norm(ops, hidden[-1:]))[0].float()

    @torch.inference_mode()
    def forward_with_images(
        self, parts: Sequence[list[int] | ImageEmbeddings], start: int, cache: KVCache, adapter: DeviceAdapter, stop: Callable[[], bool]
    ) -> torch.Tensor:
        """Evaluate a prompt of token runs and images at positions `start...` into `cache` in one pass; returns the last
        position's logits [vocab] (the prompt ends with text). Images sit where llama.cpp places them with M-RoPE:
        every token at time p (where the image starts), row p + r and column p + c; an image takes rows x columns
        cache slots and advances the text by max(rows, columns) positions. `stop` is asked before each layer."""
        if not self.architecture.rope_sections:
            raise BaseModelError(None, f"family {self.architecture.family!r} has no multi-section rotary positions for images")
        embedded: list[torch.Tensor | tuple[list[int], torch.Tensor]] = []  # an image's embeddings, or ids and positions
        sections: list[torch.Tensor] = []  # each row's (time, row, column, extra) positions
        position, n_slots = start, 0
        batches: list[int] = []  # llama.cpp's (mtmd evaluates each text run and each image on its own)
        for part in parts:
            if isinstance(part, ImageEmbeddings):
                index = torch.arange(part.rows * part.columns, device=self.device)
                batches += llamacpp_batches(len(index))
                at = torch.full_like(index, position)
                sections.append(torch.stack((at, at + index // part.columns, at + index % part.columns, torch.zeros_like(index)), dim=1))
                embedded.append(part.values.to(self.device, self.dtype))
                position, n_slots = position + max(part.rows, part.columns), n_slots + len(index)
            elif part:
                batches += llamacpp_batches(len(part))
                text_positions = torch.arange(position, position + len(part), device=self.device)
                sections.append(text_positions.unsqueeze(1).expand(-1, 4))
                embedded.append((part, text_positions))
                position, n_slots = position + len(part), n_slots + len(part)
        positions = torch.cat(sections)
        cache.reserve(cache.slot(start) + n_slots)
        ops = _ForwardPass(self.weights, adapter, cache, cache.slot(start), batches)
        hidden = torch.cat(
            [
                piece if isinstance(piece, torch.Tensor) else self.family.embed(ops, torch.tensor(piece[0], device=self.device), piece[1])
                for piece in embedded
            ]
        )
        hidden = self._layers(ops, hidden, positions, stop)
        cache.shift += n_slots - (position - start)
        last = self.family.final_norm(ops, hidden[-1:])
        return ops.multiply(self.weights.matrices["output.weight"], last)[0].float()

    @torch.inference_mode()
    def step(self, rows: list[StepRow], batch_invariant: bool = True) -> torch.Tensor:
        """One decode step for several sequences (any programs): each row's token at its position into its cache;
        returns logits [rows, vocab]. `batch_invariant`: each row bit-identical to the row stepped alone (products,
        rotary tables and attention per row); else one product per matrix over all rows and one fused attention,
        each row's numbers then depending on the batch's shape in the last bits (`PawConfig.batch_invariant`;
        llama.cpp's arithmetic is always row-exact). Rows of one program should be adjacent: each run of them takes
        the program's side paths in one product."""
        invariant = batch_invariant or self.arithmetic.row_exact
        ids = torch.tensor([row.token for row in rows], dtype=torch.long, device=self.device)
        positions = torch.tensor([row.position for row in rows], dtype=torch.long, device=self.device)
        for row in rows:
            row.cache.reserve(row.cache.slot(row.position) + 1)
        ops = _StepPass(self.weights, rows, invariant)
        hidden = self.family.embed(ops, ids, positions)
        hidden = self._layers(ops, hidden, positions, lambda: False)
        return ops.multiply(self.weights.matrices["output.weight"], self.family.final_norm(ops, hidden)).float()

    def _layers(self, ops: Ops, hidden: torch.Tensor, positions: torch.Tensor, stop: Callable[[], bool]) -> torch.Tensor:
        for layer in range(self.architecture.n_layers):
            if stop():
                raise CancelledError()
            hidden = self.family.block(ops, layer, hidden, positions)
        return hidden


class _Pass:
    """What every pass's `Ops` share: the base's tensors, embeddings, norms, one rotary table per pass, and the
    linear layers with their side paths, taken per segment of rows of one program (`multiply` multiplies)."""

    def __init__(self, weights: DeviceWeights, segments: list[tuple[int, int | None, DeviceAdapter]]) -> None:
        self.architecture = weights.architecture
        self._weights = weights
        self._tensors = weights.tensors
        self._matrices = weights.matrices
        self._groups = weights.groups
        self._segments = segments
        """Runs of rows of one program: (start, end or None for all, adapter)."""
        self._rotation: tuple[torch.Tensor, torch.Tensor] | None = None
        self.arithmetic: Arithmetic = weights.arithmetic
        self._biases_after = weights.biases_after

    def multiply(self, matrix: Product, x: torch.Tensor) -> torch.Tensor:
        """`x` times a base or LoRA matrix of this pass, all rows in one product."""
        return matrix(x)

    def accumulate(self, b: Product, y: torch.Tensor, projected: torch.Tensor, scale: float) -> None:
        """`y += scale * b(projected)`: a side path's second product added to the base product's rows."""
        b.accumulate(y, projected, scale)

    def output_rows(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """`x` [T, ...] kept to the rows whose outputs the pass returns, from the last layer's attention output on
        (llama.cpp drops the other rows there, so the feed-forward's kernels see one row)."""
        return x

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """The base product, each side path added, then a bias the product did not hold (llama.cpp's graph)."""
        y = self.multiply(self._matrices[name], x)
        for start, end, adapter in self._segments:
            self._add_side_path(y, x, start, end, adapter, name)
        bias = self._biases_after.get(name)
        return y if bias is None else y + bias

    def linears(self, x: torch.Tensor, names: tuple[str, ...]) -> list[torch.Tensor]:
        widths = self._groups.get(names)
        if widths is None:
            return [self.linear(x, name) for name in names]
        outputs = list(torch.split(self.multiply(self._matrices[names[0]], x), widths, dim=-1))
        for start, end, adapter in self._segments:
            group = adapter.groups.get(names)
            if group is None:
                for y, name in zip(outputs, names, strict=True):
                    self._add_side_path(y, x, start, end, adapter, name)
                continue
            projected = torch.split(self.multiply(group.a, x[start:end]), group.ranks, dim=-1)
            for y, p, b, scale in zip(outputs, projected, group.b, group.scales, strict=True):
                self.accumulate(b, y[start:end], p, scale)
        return outputs

    def _add_side_path(self, y: torch.Tensor, x: torch.Tensor, start: int, end: int | None, adapter: DeviceAdapter, name: str) -> None:
        """Add weight `name`'s side path of `adapter`, if adapted, to rows `start:end` of its product `y`."""
        lora = adapter.get(name)
        if lora is None:
            return
        self.accumulate(lora.b, y[start:end], self.multiply(lora.a, x[start:end]), lora.scale)

    def tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def embedding(self, ids: torch.Tensor, name: str) -> torch.Tensor:
        rows = self._weights.rows.get(name)
        if rows is not None:
            decoded = rows(ids)
            if not bool(torch.isfinite(decoded).all()):  # rows decoded on demand were not checked at load
                raise BaseModelError(None, f"base tensor {name} holds non-finite values (NaN or infinity); the file is damaged")
            return decoded.to(self._weights.dtype)
        return F.embedding(ids, self._tensors[name]).to(self._weights.dtype)

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.arithmetic.swiglu(gate, up)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return self.arithmetic.gelu(x)

    def rms_norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        return self.arithmetic.rms_norm(x, self._tensors[weight], self.architecture.norm_eps)

    def layer_norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        weight, bias = self._tensors[prefix + ".weight"], self._tensors[prefix + ".bias"]
        return self.arithmetic.layer_norm(x, weight, bias, self.architecture.norm_eps)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self._rotation is None:  # one table per pass: every layer rotates the same positions
            self._rotation = self._rotation_table(positions, x.dtype)
        return self.arithmetic.rotate(x, *self._rotation)

    def _rotation_table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        frequencies = self._weights.rope_frequencies
        if frequencies is None:
            raise BaseModelError(None, f"family {self.architecture.family!r} has no rotary embedding")
        return self.arithmetic.rotation_table(self.architecture, frequencies, positions, dtype)


class _ForwardPass(_Pass):
    """The `Ops` of one forward pass: the shared weights, one program's adapter and one sequence's KV cache."""

    def __init__(self, weights: DeviceWeights, adapter: DeviceAdapter, cache: KVCache, slot: int, batches: list[int]) -> None:
        super().__init__(weights, [(0, None, adapter)])
        self._cache = cache
        self._slot = slot
        """The first new token's slot in the cache."""
        self._batches = batches
        """The row counts of the batches llama.cpp would evaluate these rows in (its flash attention's kernel
        follows a batch's size)."""
        self._masks: dict[int, torch.Tensor] = {}

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        return self.arithmetic.attend_prompt(self.architecture, self._cache, layer, self._slot, (q, k, v), self._batches, self._masks)

    def output_rows(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return x[-1:] if self.arithmetic.keeps_last_row and layer == self.architecture.n_layers - 1 else x

    def recurrent(self, layer: int, inputs: tuple[torch.Tensor, ...], update: RecurrentUpdate) -> torch.Tensor:
        out, self._cache.states[layer] = update(inputs, self._cache.states.get(layer))
        return out


class _StepPass(_Pass):
    """The `Ops` of one decode step: one new token per row, each row with its own cache, position and program; row-exact
    (`invariant`), every product, rotation and attention runs per row (`Product.rows`), else all rows at once."""

    def __init__(self, weights: DeviceWeights, rows: list[StepRow], invariant: bool) -> None:
        segments: list[tuple[int, int | None, DeviceAdapter]] = []
        for index, row in enumerate(rows):
            if segments and segments[-1][2] is row.adapter:
                segments[-1] = (segments[-1][0], index + 1, row.adapter)
            else:
                segments.append((index, index + 1, row.adapter))
        super().__init__(weights, segments)
        self._rows = rows
        self._slots = StepSlots([(row.cache, row.cache.slot(row.position)) for row in rows])
        self._row_exact = invariant

    def multiply(self, matrix: Product, x: torch.Tensor) -> torch.Tensor:
        return matrix.rows(x) if self._row_exact else matrix.step(x)

    def accumulate(self, b: Product, y: torch.Tensor, projected: torch.Tensor, scale: float) -> None:
        (b.accumulate_rows if self._row_exact else b.accumulate)(y, projected, scale)

    def _rotation_table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # row by row when invariant: a vectorized cos/sin may round a lane differently from a lone value's
        one_row = super()._rotation_table
        if not self._row_exact:
            return one_row(positions, dtype)
        tables = [one_row(positions[i : i + 1], dtype) for i in range(len(self._rows))]
        return torch.cat([cos for cos, _ in tables]), torch.cat([sin for _, sin in tables])

    def recurrent(self, layer: int, inputs: tuple[torch.Tensor, ...], update: RecurrentUpdate) -> torch.Tensor:
        """Row by row: each row continues its own sequence's state (a state's update is cheap beside the products)."""
        outputs: list[torch.Tensor] = []
        for i, row in enumerate(self._rows):
            out, row.cache.states[layer] = update(tuple(x[i : i + 1] for x in inputs), row.cache.states.get(layer))
            outputs.append(out)
        return torch.cat(outputs)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """Each row as alone when invariant (the kernels round by shape), over the row's own positions and its
        program's prefix, which every row of the program reads in place (llama.cpp's C kernels: all rows in one
        call, a prefix converted once for its program's rows). Else one fused kernel over all rows (`attend_batched`)."""
        if not self._row_exact:
            return self.arithmetic.attend_rows(self.architecture, self._slots.rows, layer, (q, k, v))
        return self.arithmetic.attend_each_row(self.architecture, self._slots, layer, (q, k, v))
