"""Weight-only quantized linear weights: the two layouts the C kernels read, in plain torch.

Every GGUF type we serve and both `--quantize` modes map exactly onto one of two layouts, so one pair
of kernels serves them all:

- ``q4``: 4-bit unsigned codes q in [0, 15], w = q * scale + min per group of `group` weights along K
  (asymmetric). Codes are packed as GGUF's Q4_0/Q4_1 blocks pack them: per 32 weights 16 bytes, byte j
  holding element j in its low nibble and element j + 16 in its high nibble. Q4_0 (scale d, min -8d),
  Q4_1 (d, m) and Q4_K (d * sub-scale, -dmin * sub-min, per 32) are all this layout, without rounding.
- ``q8``: signed 8-bit codes, w = q * scale per group (symmetric), or w = q * scale + min with a min per
  group (asymmetric: `--quantize int8`, whose 256 levels then span each group's [min, max] instead of
  [-absmax, absmax]). Q8_0 (group 32) and Q6_K (codes -32..31, scale d * sub-scale per 16) are the
  symmetric layout, again exactly.

q4 codes have a second byte order, ``x8`` (QuantLinear switches to it when the C kernels serve): per 64
weights, 8 little-endian 32-bit words, nibble i of word j holding weight 8i + j. Then `(word >> 4i) & 15`
turns 8 codes into 8 lanes with two plain vector ops, no byte shuffles, which is what bounds the
GGUF-order kernel on AVX2 (its byte-to-lane widening runs on one shuffle port).

The kernels' own order, ``panel`` (QuantLinear's choice when out_features is a multiple of the panel
width L: the CPU's float lanes for q4, twice that for q8, so one thread reads one run of bytes): for q4,
per L output rows and 8 consecutive k, L words, nibble i of word j = code(row j, k + i); for q8, per L
output rows the codes k-major, [N / L][K][L]; scales and mins [N / L][G][L] for both. A vector op turns
one load into the codes of L rows (or VL of them) at one k, which is the layout the GEMM micro-kernel
multiplies, so nothing is transposed per call.

Scales are float16 where the source's are (GGUF's d and m) and float32 where a product of two scales
is exact only there (K-quants). Dequantizing here is exact: the products q * scale are exact in float32
and each weight is rounded once, as gguf-py (and so transformers' GGUF loader) rounds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch

Kind = Literal["q4", "q8"]
BLOCK = 32  # q4 codes are packed in blocks of 32 weights (16 bytes)


def to_panels(t: torch.Tensor, lanes: int,
              place: Callable[[torch.Tensor], torch.Tensor] = lambda x: x) -> torch.Tensor:
    """A row-major [N, C] tensor (q8 codes, scales, mins, float weights; N a multiple of `lanes`) in the
    panel order, [N / lanes][C][lanes] viewed as [N, C]; with `lanes` 0 just contiguous. `place` may copy
    the rearranged view where it should live (hugepages.in_huge_pages): the one copy either way."""
    if not lanes:
        return place(t.contiguous())
    n = t.shape[0]
    return place(t.view(n // lanes, lanes, -1).transpose(1, 2)).contiguous().view(n, -1)


def from_panels(t: torch.Tensor, lanes: int) -> torch.Tensor:
    """The inverse of `to_panels` (`t` itself when `lanes` is 0)."""
    if not lanes:
        return t
    n = t.shape[0]
    return t.view(n // lanes, -1, lanes).transpose(1, 2).reshape(n, -1)


def to_bf16_panels(t: torch.Tensor, lanes: int,
                   place: Callable[[torch.Tensor], torch.Tensor] = lambda x: x) -> torch.Tensor:
    """A float [N, K] weight (N a multiple of `lanes`, K even) rounded to bfloat16 (to nearest even) in the
    bfloat16 panel order of quant/kernels.py, [N / lanes][K / 2][lanes][2] viewed as [N, K]: per k-pair, one
    32-bit word per output row, the operand layout of AVX512-BF16's vdpbf16ps."""
    n, k = t.shape
    b = t.to(torch.bfloat16).view(n // lanes, lanes, k // 2, 2).transpose(1, 2)
    return place(b).contiguous().view(n, k)


def from_bf16_panels(t: torch.Tensor, lanes: int) -> torch.Tensor:
    """The inverse of `to_bf16_panels`, as float32 [N, K]."""
    n, k = t.shape
    return t.view(n // lanes, k // 2, lanes, 2).transpose(1, 2).reshape(n, k).float()


def bf16_panel_rows(t: torch.Tensor, index: torch.Tensor, lanes: int) -> torch.Tensor:
    """`panel_rows` of a bfloat16 panel-order tensor (`to_bf16_panels`), as float32."""
    n, k = t.shape
    return t.view(n // lanes, k // 2, lanes, 2)[index // lanes, :, index % lanes].reshape(len(index), k).float()


def panel_rows(t: torch.Tensor, index: torch.Tensor, lanes: int) -> torch.Tensor:
    """Rows `index` (1-D) of a panel-order [N, C] tensor, row-major [len(index), C], read from their
    panels alone (an embedding lookup per step must not rearrange the whole table)."""
    return t.view(t.shape[0] // lanes, -1, lanes)[index // lanes, :, index % lanes]


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear weight [out_features, in_features] in one of the two layouts above."""

    kind: Kind
    codes: torch.Tensor  # q4: uint8 [N, K / 2]; q8: int8 [N, K]
    scales: torch.Tensor  # [N, K / group], float16 or float32
    mins: torch.Tensor | None  # q4 always, q8 when asymmetric; like scales
    group: int
    in_features: int
    source: str = ""  # what it came from ("Q4_1", "int4", ...), for logs and the memory account
    order: str = "gguf"  # code byte order: "gguf" (as in the file), "x8" (q4) or "panel" (see above)
    lanes: int = 0  # "panel" order: output rows per panel

    def __post_init__(self) -> None:
        n, k, g = self.out_features, self.in_features, self.group
        if self.kind not in ("q4", "q8"):
            raise ValueError(f"unknown layout {self.kind!r}")
        step = BLOCK if self.kind == "q4" else 16
        if g % step or k % g:
            raise ValueError(f"{self.kind}: group {g} must be a multiple of {step} dividing in_features {k}")
        want = (n, k // 2) if self.kind == "q4" else (n, k)
        dtype = torch.uint8 if self.kind == "q4" else torch.int8
        if tuple(self.codes.shape) != want or self.codes.dtype != dtype:
            got = f"{self.codes.dtype} {tuple(self.codes.shape)}"
            raise ValueError(f"{self.kind} codes must be {dtype} {want}, got {got}")
        if tuple(self.scales.shape) != (n, k // g) or self.scales.dtype not in (torch.float16, torch.float32):
            raise ValueError(f"scales must be float16/float32 {(n, k // g)}, got {self.scales.dtype} "
                             f"{tuple(self.scales.shape)}")
        if self.order not in ("gguf", "x8", "panel") or (self.order == "x8" and (self.kind != "q4" or k % 64)):
            raise ValueError(f"byte order {self.order!r} is for q4 codes with in_features % 64 == 0")
        if self.order == "panel" and (self.lanes <= 0 or n % self.lanes):
            raise ValueError(f"byte order 'panel' is for out_features a multiple of {self.lanes} lanes")
        if self.order != "panel" and self.lanes:
            raise ValueError(f"lanes are for the 'panel' byte order, not {self.order!r}")
        if self.mins is None and self.kind == "q4":
            raise ValueError("q4 needs mins")
        if self.mins is not None and (self.mins.shape != self.scales.shape or self.mins.dtype != self.scales.dtype):
            raise ValueError("mins must match scales in shape and dtype")

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.codes, self.scales, self.mins) if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def contiguous(self) -> QuantizedWeight:
        return self.placed(lambda t: t)

    def placed(self, place: Callable[[torch.Tensor], torch.Tensor]) -> QuantizedWeight:
        """The same weight, each tensor made contiguous and passed through `place` (which returns an equal
        tensor, possibly elsewhere in memory)."""
        return replace(self, codes=place(self.codes.contiguous()), scales=place(self.scales.contiguous()),
                       mins=None if self.mins is None else place(self.mins.contiguous()))

    def rows(self, index: torch.Tensor | slice) -> QuantizedWeight:
        """A subset (or permutation) of output rows: rows are quantized independently, so this is exact."""
        if self.order == "panel":
            return self._panel_rows(torch.arange(self.out_features)[index] if isinstance(index, slice) else index)
        pick = (lambda t: t[index]) if isinstance(index, slice) else (lambda t: t.index_select(0, index))
        return replace(self, codes=pick(self.codes), scales=pick(self.scales),
                       mins=None if self.mins is None else pick(self.mins)).contiguous()

    def _panel_rows(self, index: torch.Tensor) -> QuantizedWeight:
        """Rows `index` of a panel-order weight in the file's order (`panel_rows`)."""
        k = self.in_features
        gather = lambda t: panel_rows(t, index, self.lanes)  # noqa: E731
        if self.kind == "q8":
            codes = gather(self.codes)
        else:  # words: nibble i of word j = code(row, 8 j + i); GGUF blocks: element j low, j + 16 high nibble
            words = gather(self.codes.view(torch.int32))
            q = ((words[..., None] >> torch.arange(0, 32, 4, dtype=torch.int32)) & 15).to(torch.uint8)
            pairs = q.view(len(index), k // BLOCK, 2, BLOCK // 2)
            codes = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(len(index), k // 2)
        return replace(self, codes=codes.contiguous(), scales=gather(self.scales).contiguous(),
                       mins=None if self.mins is None else gather(self.mins).contiguous(), order="gguf", lanes=0)

    def columns(self, start: int, stop: int) -> QuantizedWeight:
        """Input features [start, stop), which must fall on group boundaries (a row-parallel shard)."""
        if start % self.group or stop % self.group:
            raise ValueError(f"columns {start}:{stop} do not fall on {self.group}-weight group boundaries")
        if self.order == "panel" or (self.order == "x8" and (start % 64 or stop % 64)):
            return self.with_order("gguf").columns(start, stop)
        per_byte = 2 if self.kind == "q4" else 1
        g0, g1 = start // self.group, stop // self.group
        return replace(self, codes=self.codes[:, start // per_byte:stop // per_byte], scales=self.scales[:, g0:g1],
                       mins=None if self.mins is None else self.mins[:, g0:g1], in_features=stop - start).contiguous()

    def dequantize(self, rows: torch.Tensor | slice | None = None) -> torch.Tensor:
        """float32 [N, K] (or the chosen rows) in plain torch: the reference and the fallback."""
        w = self if rows is None else self.rows(rows)
        n, k, g = w.out_features, w.in_features, w.group
        if w.kind == "q4":
            q = w.q4_codes().view(n, k // g, g).float()
            scales, mins = from_panels(w.scales, w.lanes), from_panels(w.mins, w.lanes)
            return (q * scales.float()[..., None] + mins.float()[..., None]).view(n, k)
        q = w.q8_codes().view(n, k // g, g).float() * from_panels(w.scales, w.lanes).float()[..., None]
        return (q if w.mins is None else q + from_panels(w.mins, w.lanes).float()[..., None]).view(n, k)

    def q8_codes(self) -> torch.Tensor:
        """The q8 codes [N, K] in weight order."""
        return from_panels(self.codes, self.lanes)

    def q4_codes(self) -> torch.Tensor:
        """The q4 codes one per byte, [N, K], in weight order."""
        n, k = self.codes.shape[0], self.in_features
        if self.order == "panel":  # words [N / L][K / 8][L]: nibble i of word j = code(row j, k + i)
            lanes = self.lanes
            words = self.codes.contiguous().view(torch.int32).view(n // lanes, k // 8, lanes)
            shifts = torch.arange(0, 32, 4, dtype=torch.int32).view(1, 1, 1, 8)
            q = (words[..., None] >> shifts) & 15  # [N / L, K / 8, L, 8]
            return q.permute(0, 2, 1, 3).to(torch.uint8).reshape(n, k)
        if self.order == "x8":
            words = self.codes.contiguous().view(torch.int32).view(n, k // 64, 8)  # little-endian words
            shifts = torch.arange(0, 32, 4, dtype=torch.int32).view(1, 1, 8, 1)
            return ((words[:, :, None, :] >> shifts) & 15).to(torch.uint8).view(n, k)  # [., ., i, j]
        packed = self.codes.view(n, k // BLOCK, BLOCK // 2)
        return torch.cat([packed & 15, packed >> 4], dim=-1).view(n, k)

    def with_order(self, order: str, lanes: int = 0) -> QuantizedWeight:
        """The same weight with its codes in `order` (same bytes, rearranged); "panel" takes `lanes`."""
        if order == self.order and (order != "panel" or lanes == self.lanes):
            return self
        n, k = self.codes.shape[0], self.in_features
        if order == "x8" and (self.kind != "q4" or k % 64):
            raise ValueError(f"byte order 'x8' is for q4 codes with in_features % 64 == 0, not {self.kind} {k}")
        q = self.q4_codes() if self.kind == "q4" else self.q8_codes()
        scales = from_panels(self.scales, self.lanes)
        mins = None if self.mins is None else from_panels(self.mins, self.lanes)
        if order == "panel":
            if lanes <= 0 or n % lanes:
                raise ValueError(f"byte order 'panel' is for out_features a multiple of {lanes}, not {n}")
            if self.kind == "q4":
                parts = q.view(n // lanes, lanes, k // 8, 8).permute(0, 2, 1, 3).to(torch.int64)
                words = (parts << (4 * torch.arange(8))).sum(dim=-1)  # [N / L, K / 8, L]
                codes = words.to(torch.int32).contiguous().view(torch.uint8).view(n, k // 2)
            else:  # [N / L][K][L]
                codes = to_panels(q, lanes)
            return replace(self, codes=codes, scales=to_panels(scales, lanes),
                           mins=None if mins is None else to_panels(mins, lanes), order=order, lanes=lanes)
        if self.kind == "q8":
            return replace(self, codes=q.contiguous(), scales=scales, mins=mins, order=order, lanes=0)
        if order == "x8":
            parts = q.view(n, k // 64, 8, 8).to(torch.int64) << (4 * torch.arange(8).view(1, 1, 8, 1))
            words = parts.sum(dim=2)  # [n, k/64, 8]: word j = sum_i code(8i + j) << 4i
            codes = words.to(torch.int32).contiguous().view(torch.uint8).view(n, k // 2)
        else:
            pairs = q.view(n, k // BLOCK, 2, BLOCK // 2)
            codes = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, k // 2)
        return replace(self, codes=codes.contiguous(), scales=scales, mins=mins, order=order, lanes=0)


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Fuse linears along the output dim (q/k/v, gate/up): their layouts must agree."""
    first = parts[0]
    if len(parts) == 1:
        return first
    for p in parts[1:]:
        if (p.kind, p.group, p.in_features, p.scales.dtype, p.order, p.lanes) != (
                first.kind, first.group, first.in_features, first.scales.dtype, first.order, first.lanes):
            raise ValueError(f"cannot fuse {first.source} and {p.source} weights: layouts differ")
    cat = lambda ts: torch.cat(ts, dim=0)  # noqa: E731
    return replace(first, codes=cat([p.codes for p in parts]), scales=cat([p.scales for p in parts]),
                   mins=None if first.mins is None else cat([p.mins for p in parts]))


def _scale_dtype(scales: torch.Tensor, *others: torch.Tensor) -> torch.dtype:
    """float16 when every value fits it (half the scale bytes), else float32."""
    return torch.float16 if all(t.abs().max() < 6e4 for t in (scales, *others)) else torch.float32


def _round_to_grid(w: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, low: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes in [low, 127] of groups w [N, G, g] on the grid base + q * scale, and each group's squared error."""
    scale, base = scale.float()[..., None], base.float()[..., None]
    q = torch.round((w - base) / scale).clamp(low, 127)
    return q, (q * scale + base - w).square().sum(-1)


def quantize_int8(weight: torch.Tensor, group: int | None = None) -> QuantizedWeight:
    """int8 per group along K (per output channel when group is None), w = q * scale + min, each group on
    whichever of two grids reproduces it with the smaller squared error:

    - asymmetric: 256 levels from the group's min to its max (q in [-128, 127], min the level of q = 0).
      Its step is never larger than symmetric's (max - min <= 2 absmax), and a group that sits on a coarser
      asymmetric grid (a Q4_1 model's 16 levels: 255 = 15 x 17) is held almost exactly.
    - symmetric absmax (min 0, q in [-127, 127]): what holds a group that already sits on such a grid (a
      Q8_0 tensor's) exactly, where the asymmetric grid would not.
    """
    n, k = weight.shape
    group = group or k
    w = weight.detach().float().reshape(n, k // group, group)
    lo, hi, absmax = w.amin(-1), w.amax(-1), w.abs().amax(-1)
    dtype = _scale_dtype(lo, hi)
    sa = ((hi - lo) / 255.0).clamp(min=1e-12).to(dtype)  # asymmetric: scale, and the min at q = 0
    ba = (lo + 128.0 * sa.float()).to(dtype)
    ss = (absmax / 127.0).clamp(min=1e-12).to(dtype)  # symmetric: min 0
    bs = torch.zeros_like(ss)
    qa, ea = _round_to_grid(w, sa, ba, -128)
    qs, es = _round_to_grid(w, ss, bs, -127)
    symmetric = es <= ea  # [N, G]
    codes = torch.where(symmetric[..., None], qs, qa).to(torch.int8).reshape(n, k)
    scales, mins = torch.where(symmetric, ss, sa), torch.where(symmetric, bs, ba)
    return QuantizedWeight("q8", codes, scales, mins, group, k, source=f"int8 g{group}")


def quantize_int4(weight: torch.Tensor, group: int = 32) -> QuantizedWeight:
    """Asymmetric uint4 per group (min and step per group, like GGUF's Q4_1)."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group, group)
    lo, hi = w.amin(-1), w.amax(-1)
    dtype = _scale_dtype(lo, hi)
    scales = ((hi - lo) / 15.0).clamp(min=1e-8).to(dtype)
    mins = lo.to(dtype)
    q = torch.round((w - mins.float()[..., None]) / scales.float()[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.reshape(n, k // BLOCK, 2, BLOCK // 2)
    codes = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, k // 2)
    return QuantizedWeight("q4", codes.contiguous(), scales, mins, group, k, source=f"int4 g{group}")
