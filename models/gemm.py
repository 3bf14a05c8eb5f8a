r"""The project's one GEMM convolution: a torchvision ResNet (BasicBlock: ResNet-18/34) whose
convolutions are im2col + GEMM, for N runs at once (a pack, :mod:`packed.model`'s ``mode="gemm"``)
or for one run (a pack of one: :class:`models.gemm_resnet.GemmResNet`, ``model.conv_impl=gemm``);
what it reads from the model is its :class:`~models.gemm_plan.Plan`.

Why. ``vmap`` turns each convolution of a pack into one cuDNN *grouped* convolution (the run
axis folded into channels, ``groups=N``), measured at ~7 TFLOP/s in backward on an H100, plus an
NCHW <-> NHWC transpose per layer. Per run, a convolution is one GEMM
:math:`Y_n = A_n W_n` with :math:`A_n \in \mathbb{R}^{M \times K}` the im2col patches
(:math:`M = B H_o W_o` rows, :math:`K = k_h k_w C_{in}` columns) and
:math:`W_n \in \mathbb{R}^{K \times C_{out}}`; N runs are one strided-batched GEMM,
``torch.bmm`` over the run axis. This is the horizontal fusion of HFTA (Wang et al., MLSys 2021,
"Horizontally Fused Training Array") written with GEMMs instead of grouped convolutions, the
route suggested on the pytorch/functorch tracker for slow vmapped convolutions (unfold +
matmul). On one CPU core the same GEMMs beat oneDNN's direct convolutions for a lone run too:
``torch.matmul`` reaches 130-150 GFLOP/s in float32 on this network's shapes where oneDNN's
convolutions (forward and backward) reach 25-40 (``results/cpu_step/``).

Layout: run-major channels-last ``[N, B, H, W, C]``, contiguous. The GEMM's output ``[N, M, C_out]``
*is* the next activation in this layout (a view, no copy); BatchNorm reduces dim 1 of the
``[N, M, C]`` view; ReLU, the residual add and the pooling keep the layout; the only copies are
the im2col gathers (innermost runs of C contiguous values on both sides) and, for a pack, the
weight reorder ``[N, C_out, C_in, k_h, k_w] -> [N, k_h k_w C_in, C_out]``. A lone run keeps its
weights channels-last (``[C_out, k_h, k_w, C_in]`` in memory), so the reorder is a transposed view,
the GEMM reads it in place (BLAS's transposed operand) and ``torch.mm``'s backward hands back the
weight gradient in that same layout: no per-step copy of weights or of their gradients (except
for the whole-map convolutions below, whose matrix is a gather of the weight). HFTA's
channels-last layout ``[B, H, W, N C]`` also feeds ``bmm`` as a strided view, but every ``bmm``
writes ``[N, M, C]``, so keeping that layout costs one transpose copy per convolution; it exists
for cuDNN's grouped kernels, which this mode replaces. Hence one layout, not a parameter.

im2col (:func:`im2col`). On CUDA it is ``Tensor.unfold`` (strided windows of the padded
activation) and one reshape copy; its backward, ``unfold_backward``, gathers each input gradient
from the windows that hold it: deterministic, so two runs of a pack (graph vs eager, NaN
isolation) agree bit for bit, where an index gather's CUDA backward adds with atomics in no fixed
order. On the CPU, where a backward is needed, it is an index gather (``index_select`` of pixel
rows): its backward, ``index_add_``, runs in a fixed order there (deterministic) and is ~5x faster
than ``unfold_backward`` (one 8x8, 64-channel convolution, N=4, B=64: 32 vs 169 ms); for the images
into the stem (3 channels, no backward) ``unfold``'s single strided copy is the faster forward.

Taps that meet only padding are dropped (per axis, the tap range that meets a pixel for some
output position; the weight is sliced and the padding shrunk to match): at 1x1 spatial a 3x3
convolution with padding 1 is its centre tap, a plain GEMM with ``K = C_in`` and no im2col; the
2x2 -> 1x1 stride-2 convolution keeps its 2x2 taps that meet pixels (``K = 4 C_in``, not 9). The
dropped taps multiplied exact zeros, so nothing changes but rounding order; their weight gradient
is exactly zero, as in ``F.conv2d`` (so weight decay, applied by the optimizer to the whole
weight, moves them exactly as it would there).

Whole maps (:func:`dense`, on the CPU). Where the input has fewer positions than the kernel has
kept taps, im2col multiplies more than the convolution's whole linear map would: at 2x2 a 3x3
convolution with padding 1 reads 9 taps per output position, 5 of them padding, where the map
multiplies the 4 input positions. There the convolution is one GEMM of the channels-last
activation ``[B, H W C_in]`` (a view) with the map's matrix ``[H W C_in, H_o W_o C_out]``, gathered
from the weight each step: 4/9 of the multiply-adds and no im2col. In ResNet-18 these are the
3x3 convolutions at 2x2 (layer3 at 32 px, layer4 at 50 px); the strided 2x2 -> 1x1 convolution
keeps 4 taps for 4 positions and stays im2col.

The direct kernel beside the GEMMs (``direct_ratio``, a lone run on the CPU: ``model.conv_impl=mixed``,
:class:`models.gemm_resnet.GemmResNet`). The GEMMs win where maps are small for their width: at
2x2 and 1x1 most taps meet padding (dropped here, computed by oneDNN) and oneDNN's backward is
slow there (``python -m scripts.cpu.bench_layers``: at 32 px, batch 64, one Xeon core, layer3's
256-channel 2x2 convolution took 22.3 ms forward + backward direct, 10.6 ms as GEMMs). Where the
map is large for its width oneDNN's direct kernel needs no im2col copy and no scatter-add
backward and wins (layer1, 64 channels at 8x8: 8.0 vs 16.3 ms). A 1x1 convolution has no im2col
to save, and its GEMM won at every size measured. So a lone run may compute each convolution of
more than one tap whose output has at least ``direct_ratio`` positions per image per output
channel with ``F.conv2d`` on the same channels-last memory (a view both ways: no copy of
activations, weights or gradients), and the rest as GEMMs. Same math (float64: equal to
torchvision's to summation order); the split is a function of shapes only, so a run keeps it on
every machine.

BatchNorm in training mode uses each run's batch statistics and updates its running statistics
in place with torch's formula (``momentum * batch + (1 - momentum) * running``, the unbiased
variance for ``running_var``, ``num_batches_tracked += 1``; ``momentum=None``: the cumulative
average); in eval mode, the running statistics; the mode is per BatchNorm (``training`` may map
each BatchNorm's prefix to its mode, as a model in ``eval()`` with its BatchNorms in ``train()``
evaluates: :func:`run.builders.predict`'s ``bn_mode="train"``). Half-precision inputs (autocast)
are normalised in float32 and cast back, as cuDNN's BatchNorm does. Autograd derives the whole
backward.

Precision. A lone run's cuDNN convolutions use TF32 by default (``torch.backends.cudnn.allow_tf32``)
while a matmul does not (``torch.backends.cuda.matmul.allow_tf32``, default off), so on CUDA the
convolution GEMMs run with the matmul flag set to cuDNN's, forward and backward (a pre-hook and a
hook on each GEMM's backward node), and the flag is restored right after each; the head's
matmul keeps the caller's setting, as a lone ``nn.Linear`` does. A CUDA graph records the math
mode of each captured GEMM, so a capture of this forward replays the same precision. On the CPU,
``operands="bf16"`` runs the convolution GEMMs (forward and both backward GEMMs) with oneDNN's
bf16 math mode (``torch.backends.mkldnn.matmul.fp32_precision="bf16"``, scoped the same way): the
operands are rounded to bfloat16, products accumulate in float32 and the outputs are float32, the
CPU counterpart of TF32; weights, activations, BatchNorm and its statistics stay float32. oneDNN
reads the mode as a permission, not an order: where it has no bf16 kernel for the operation on
this CPU it runs its float32 kernel, and ``operands="bf16"`` is then float32 arithmetic (on an AMD
EPYC with AVX512-BF16 and no AMX, 2026-11-29: GEMM and convolution results as close to the
float64 product as plain float32's, where an Intel Xeon with AMX-BF16 rounds).
:func:`bf16_math` probes which, once per process, and every run records it
(:func:`models.conv_select.machine`). In float64 the flags do nothing: the GEMMs are exact up
to summation order (float64 pack vs lone runs: ``tests/test_packed_gemm.py``; lone GEMM model vs
torchvision's: ``tests/test_cpu_gemm.py``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from lpmetrics.models.gemm_plan import Block, Conv, GemmPlanError, Norm, Plan, plan

__all__ = ["Block", "Conv", "GemmPlanError", "Norm", "Plan", "batch_norm", "bf16_math", "bmm", "conv", "dense",
           "dense_cheaper", "direct", "direct_split",
           "forward", "gemm", "im2col", "max_pool", "plan", "taps"]


class _Flag:
    """Sets one global math flag (``get`` / ``put`` a value) for the span of a GEMM and restores
    the previous value on exit; nested uses restore in order."""

    def __init__(self, get: Callable[[], object], put: Callable[[object], None], value) -> None:
        self._get, self._put, self._value, self._saved = get, put, value, []

    def __enter__(self) -> None:
        self._saved.append(self._get())
        self._put(self._value)

    def __exit__(self, *exc) -> None:
        self._put(self._saved.pop())


def _set_matmul_tf32(on) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on


def _set_cpu_matmul(precision) -> None:
    torch.backends.mkldnn.matmul.fp32_precision = precision


def _like_cudnn() -> _Flag:
    """``torch.backends.cuda.matmul.allow_tf32`` set to ``torch.backends.cudnn.allow_tf32`` (the
    precision a lone run's convolutions use)."""
    return _Flag(lambda: torch.backends.cuda.matmul.allow_tf32, _set_matmul_tf32,
                 torch.backends.cudnn.allow_tf32)


def _bf16_operands() -> _Flag:
    """oneDNN's bf16 math mode for float32 CPU GEMMs: bf16 operands, float32 accumulation and
    output."""
    return _Flag(lambda: torch.backends.mkldnn.matmul.fp32_precision, _set_cpu_matmul, "bf16")


#: ``operands`` of :func:`conv` / :func:`forward`: ``None`` (the GEMM in its inputs' dtype) or
#: ``"bf16"`` (float32 inputs, bf16 operands on the CPU: the module docstring)
OPERANDS = (None, "bf16")


def _scoped(gemm: Callable[[], torch.Tensor], flag: _Flag | None) -> torch.Tensor:
    """``gemm()`` under ``flag``, and its backward node under the same flag (a pre-hook enters
    it, a hook leaves it). If the backward node raises, the flag stays set until the process ends
    or something resets it."""
    if flag is None:
        return gemm()
    with flag:
        out = gemm()
    if out.grad_fn is not None:
        out.grad_fn.register_prehook(lambda grad_outputs: flag.__enter__())
        out.grad_fn.register_hook(lambda grad_inputs, grad_outputs: flag.__exit__())
    return out


def bmm(a: torch.Tensor, b: torch.Tensor, like_cudnn: bool | None = None) -> torch.Tensor:
    """``torch.bmm(a, b)`` with the matmul TF32 flag set as cuDNN's, in the forward and in its
    backward node (``like_cudnn``: default on CUDA only)."""
    if like_cudnn is None:
        like_cudnn = a.is_cuda
    return _scoped(lambda: torch.bmm(a, b), _like_cudnn() if like_cudnn else None)


def gemm(a: torch.Tensor, w: torch.Tensor, operands: str | None = None) -> torch.Tensor:
    """``[N, M, K] @ [N, K, C_out]`` per run, in the convolution's precision (module docstring).

    A lone run on the CPU (``N = 1``) is one ``torch.mm``, whose backward returns the weight's
    gradient in the weight's own (transposed, channels-last) layout where ``bmm``'s would be
    row-major, i.e. a copy per step when the gradient is accumulated into the parameter."""
    if operands not in OPERANDS:
        raise ValueError(f"operands must be one of {OPERANDS}; got {operands!r}")
    if a.is_cuda:
        return _scoped(lambda: torch.bmm(a, w), _like_cudnn())
    flag = _bf16_operands() if operands == "bf16" and a.dtype == torch.float32 else None
    if a.shape[0] == 1:
        return _scoped(lambda: torch.mm(a.squeeze(0), w.squeeze(0)), flag).unsqueeze(0)   # views, not selects
    return _scoped(lambda: torch.bmm(a, w), flag)


def taps(size: int, k: int, stride: int, pad: int) -> tuple[int, int, int, int, int]:
    """One axis of a convolution: (first tap that meets a pixel, taps kept, padding before and
    after for the kept taps, output size). Tap ``t`` of output ``o`` reads input
    ``o * stride - pad + t``; the taps that meet a pixel for some ``o`` form one range."""
    out = (size + 2 * pad - k) // stride + 1
    first, last = max(0, pad - (out - 1) * stride), min(k - 1, size - 1 + pad)
    kept, before = last - first + 1, pad - first
    after = max(0, (out - 1) * stride - before + kept - 1 - (size - 1))
    return first, kept, before, after, out


SHORT_ROWS = 16   # channels below which a pixel row is too short for a fast row gather


@functools.lru_cache(maxsize=64)
def _gather_index(b: int, hp: int, wp: int, rk: int, ck: int, stride: tuple[int, int], ho: int,
                  wo: int, device: torch.device) -> torch.Tensor:
    """Row of each patch entry in the ``[B * H_p * W_p, C]`` pixel rows of a padded activation, in
    im2col order ``(b, o_h, o_w, tap_h, tap_w)``: ``[B H_o W_o k_h k_w]`` (int64)."""
    rows = (torch.arange(ho) * stride[0])[:, None] + torch.arange(rk)[None, :]      # [H_o, k_h]
    cols = (torch.arange(wo) * stride[1])[:, None] + torch.arange(ck)[None, :]      # [W_o, k_w]
    pixel = rows[:, None, :, None] * wp + cols[None, :, None, :]                       # [H_o, W_o, k_h, k_w]
    first = torch.arange(b) * (hp * wp)
    return (first[:, None, None, None, None] + pixel[None]).reshape(-1).to(device)


def im2col(h: torch.Tensor, rk: int, ck: int, stride: tuple[int, int], ho: int, wo: int) -> torch.Tensor:
    """Patches ``[N, B H_o W_o, k_h k_w C]`` of the padded ``h [N, B, H_p, W_p, C]`` (module
    docstring: on the CPU an index gather of pixel rows, but ``unfold`` for rows shorter than
    :data:`SHORT_ROWS` channels that need no backward, the images into the stem, where its one
    strided copy is 4.6x faster than gathering 3-value rows; a 1x1 tap at stride 1 is ``h``)."""
    n, b, hp, wp, c = h.shape
    if (rk, ck) == (1, 1) and (hp, wp) == (ho, wo):
        return h.reshape(n, b * ho * wo, c)
    if h.is_cuda or (c < SHORT_ROWS and not (h.requires_grad and torch.is_grad_enabled())):
        patches = h.unfold(2, rk, stride[0]).unfold(3, ck, stride[1])
        if patches.shape[2:4] != (ho, wo):   # slice only where needed: its backward fills a zero tensor
            patches = patches[:, :, :ho, :wo]
        return patches.permute(0, 1, 2, 3, 5, 6, 4).reshape(n, b * ho * wo, rk * ck * c)
    index = _gather_index(b, hp, wp, rk, ck, tuple(stride), ho, wo, h.device)
    pixels = h.reshape(n, b * hp * wp, c)
    if n == 1:
        return pixels.squeeze(0).index_select(0, index).view(1, b * ho * wo, rk * ck * c)
    return pixels.index_select(1, index).view(n, b * ho * wo, rk * ck * c)


class _KeptTaps(torch.autograd.Function):
    """``weight[:, :, :, r0:r0 + rk, c0:c0 + ck]`` (a view) whose backward writes the gradient
    into one zero tensor in the weight's own layout (two slices' backward would fill and copy
    twice, row-major, and the channels-last parameter would copy it once more)."""

    @staticmethod
    def forward(ctx, weight, r0, rk, c0, ck):
        ctx.save_for_backward(weight)   # for its layout only: nothing is copied
        ctx.taps = (r0, rk, c0, ck)
        return weight[:, :, :, r0:r0 + rk, c0:c0 + ck]

    @staticmethod
    def backward(ctx, grad):
        (weight,), (r0, rk, c0, ck) = ctx.saved_tensors, ctx.taps
        full = torch.zeros_like(weight)
        full[:, :, :, r0:r0 + rk, c0:c0 + ck] = grad
        return full, None, None, None, None


def _set_cpu_conv(precision) -> None:
    torch.backends.mkldnn.conv.fp32_precision = precision


def _bf16_conv_operands() -> _Flag:
    """oneDNN's bf16 math mode for float32 CPU convolutions (the direct kernel's counterpart of
    :func:`_bf16_operands`)."""
    return _Flag(lambda: torch.backends.mkldnn.conv.fp32_precision, _set_cpu_conv, "bf16")


@functools.cache
def bf16_math() -> dict[str, str]:
    """What oneDNN's bf16 math mode does on this CPU, per operation: ``{"matmul": m, "conv": c}``,
    each ``"bf16"`` (float32 operands rounded to bfloat16, as :func:`_bf16_operands` asks),
    ``"fp32"`` (the mode ignored: float32 kernels; the module docstring) or ``"unknown (why)"``
    where the probe itself fails (a torch without the flags). Probed on one product of
    the shapes the models run (a 3x3 convolution of 64 channels at 8x8, and its GEMM), against
    the float64 products of the float32 operands and of their bfloat16 roundings: the result is
    nearer to one of them by orders of magnitude (a float32 product is ~1e-7 from the first and
    ~1e-3 from the second)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 576, generator=g), torch.randn(576, 64, generator=g)
    x = torch.randn(4, 64, 8, 8, generator=g).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, generator=g).contiguous(memory_format=torch.channels_last)

    def nearer(f, flag, *args) -> str:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            got = _scoped(lambda: f(*args), flag).double()
            exact = f(*(t.double() for t in args))
            rounded = f(*(t.bfloat16().double() for t in args))
        return "bf16" if (got - rounded).norm() < (got - exact).norm() else "fp32"

    try:
        return {"matmul": nearer(torch.mm, _bf16_operands(), a, b),
                "conv": nearer(lambda i, k: F.conv2d(i, k, padding=1), _bf16_conv_operands(), x, w)}
    except Exception as err:   # a torch without these flags (a lent GPU's may differ from the pin)
        return dict.fromkeys(("matmul", "conv"), f"unknown ({type(err).__name__}: {err})")


def runs_direct(taps: int, positions: int, cout: int, direct_ratio: float | None) -> bool:
    """Whether a lone run's convolution of ``taps`` taps, ``positions`` output positions per image
    and ``cout`` output channels runs by the direct kernel (module docstring; ``None``: never)."""
    return direct_ratio is not None and taps > 1 and positions >= direct_ratio * cout


def direct_split(plan_: Plan, weight_shapes: Mapping[str, tuple], height: int, width: int,
                 direct_ratio: float | None) -> dict[str, bool]:
    """Which convolutions of a lone run on ``height x width`` images run by the direct kernel
    (:func:`runs_direct`), by weight key, walked through the plan without computing anything
    (``weight_shapes``: each convolution weight's ``[C_out, C_in, k_h, k_w]``)."""
    split: dict[str, bool] = {}

    def visit(c: Conv, h: int, w: int) -> tuple[int, int]:
        cout, _, kh, kw = weight_shapes[c.weight][-4:]
        ho, wo = taps(h, kh, c.stride[0], c.padding[0])[4], taps(w, kw, c.stride[1], c.padding[1])[4]
        _check_output(ho, wo, kh, kw, c, h, w)   # where the forward would refuse the image size too
        split[c.weight] = runs_direct(kh * kw, ho * wo, cout, direct_ratio)
        return ho, wo

    h, w = visit(plan_.stem, height, width)
    if plan_.pool is not None:   # torch's own size arithmetic (ceil_mode included) on an empty map
        h, w = F.max_pool2d(torch.zeros(1, 1, h, w), **plan_.pool).shape[-2:]
    for blk in plan_.blocks:
        h1, w1 = visit(blk.conv1, h, w)
        visit(blk.conv2, h1, w1)
        if blk.down is not None:
            visit(blk.down[0], h, w)
        h, w = h1, w1
    return split


def direct(h: torch.Tensor, weight: torch.Tensor, spec: Conv, operands: str | None = None) -> torch.Tensor:
    """The same convolution as :func:`conv` for a lone run on the CPU, by torch's direct kernel
    (``F.conv2d``: oneDNN in float32) on the channels-last view of ``h [1, B, H, W, C_in]``;
    ``[1, B, H_o, W_o, C_out]``. ``operands="bf16"``: oneDNN's bf16 math mode for convolutions,
    scoped like :func:`gemm`'s."""
    if h.shape[0] != 1 or h.is_cuda:
        raise ValueError(f"the direct kernel computes a lone run on the CPU; got {h.shape[0]} run(s) "
                         f"on {h.device} (model.conv_impl=mixed and mixed16 are CPU paths: on CUDA use stock or auto)")
    if operands not in OPERANDS:
        raise ValueError(f"operands must be one of {OPERANDS}; got {operands!r}")
    x = h.squeeze(0).permute(0, 3, 1, 2)                 # NCHW view of channels-last memory
    flag = _bf16_conv_operands() if operands == "bf16" and h.dtype == torch.float32 else None
    y = _scoped(lambda: F.conv2d(x, weight.squeeze(0), stride=spec.stride, padding=spec.padding), flag)
    return y.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).unsqueeze(0)


def dense_cheaper(height: int, width: int, taps_kept: int, on_cuda: bool = False) -> bool:
    """Whether a convolution whose input has ``height x width`` positions and ``taps_kept`` taps that
    meet pixels is cheaper as its whole linear map (:func:`dense`) than as im2col + GEMM: it is
    when the input has fewer positions than the kernel has kept taps (per output position the map
    multiplies every input position once, im2col every kept tap). On the CPU only: the GPU's pack
    modes were measured and gated with the im2col form."""
    return not on_cuda and height * width < taps_kept


@functools.lru_cache(maxsize=64)
def _map_index(height: int, width: int, kh: int, kw: int, stride: tuple[int, int], padding: tuple[int, int],
               cout: int, device: torch.device) -> tuple[torch.Tensor, bool]:
    """Row of the map's matrix entries in the weight's ``[C_out (k_h k_w + holes), C_in]`` tap rows,
    in the matrix's order ``(o_h, o_w, c_out, i_h, i_w)``: ``[H_o W_o C_out H W]`` (int64); a pair of
    positions that shares no tap reads tap ``k_h k_w`` (one past the last: zeros). Also whether
    some pair shares no tap (``holes``: that zero tap is then needed)."""
    ho, wo = taps(height, kh, stride[0], padding[0])[4], taps(width, kw, stride[1], padding[1])[4]
    ty = torch.arange(height)[None, :] - torch.arange(ho)[:, None] * stride[0] + padding[0]   # [H_o, H]
    tx = torch.arange(width)[None, :] - torch.arange(wo)[:, None] * stride[1] + padding[1]    # [W_o, W]
    ty, tx = ty[:, None, :, None], tx[None, :, None, :]                                         # [H_o, W_o, H, W]
    inside = (ty >= 0) & (ty < kh) & (tx >= 0) & (tx < kw)
    holes = bool((~inside).any())
    tap = torch.where(inside, ty * kw + tx, kh * kw).reshape(ho * wo, 1, height * width)
    rows = torch.arange(cout)[None, :, None] * (kh * kw + holes) + tap                          # [H_o W_o, C_out, H W]
    return rows.reshape(-1).to(device), holes


def _check_output(ho: int, wo: int, kh: int, kw: int, spec: Conv, height: int, width: int) -> None:
    if ho < 1 or wo < 1:
        raise ValueError(f"a {kh}x{kw} convolution with padding {tuple(spec.padding)} has no output on a "
                         f"{height}x{width} input")


def dense(h: torch.Tensor, weight: torch.Tensor, spec: Conv, operands: str | None = None) -> torch.Tensor:
    """The same convolution as :func:`conv` as its whole linear map: ``h [N, B, H, W, C_in]`` read
    as ``[N, B, H W C_in]`` (a view for a contiguous channels-last ``h``; no im2col) times the map's
    matrix ``[N, H W C_in, H_o W_o C_out]``, gathered from the weight's taps by one row gather (its
    transpose ``[N, H_o W_o C_out, H W C_in]``, whose rows are runs of ``C_in`` weights; zero where an
    input position meets no tap of an output position); the product is ``[N, B, H_o, W_o, C_out]``
    as it stands. Cheaper than im2col where the input has fewer positions than the kernel has kept
    taps (:func:`dense_cheaper`): at 2x2 a 3x3 convolution with padding 1 multiplies 4 input
    positions per output position where im2col multiplies 9 taps, 5 of them zero padding. The
    gather's backward adds each tap's gradient from every pair that uses it (``index_add``,
    deterministic on the CPU) into the weight's own layout; a tap that no pair uses gets a zero
    gradient, as in ``F.conv2d``."""
    n, b, height, width, cin = h.shape
    cout, kh, kw = weight.shape[1], weight.shape[3], weight.shape[4]
    ho, wo = taps(height, kh, spec.stride[0], spec.padding[0])[4], taps(width, kw, spec.stride[1], spec.padding[1])[4]
    _check_output(ho, wo, kh, kw, spec, height, width)
    rows, holes = _map_index(height, width, kh, kw, tuple(spec.stride), tuple(spec.padding), cout, h.device)
    taps_ = weight.permute(0, 1, 3, 4, 2).reshape(n, cout, kh * kw, cin)   # a view for channels-last weights
    if holes:
        taps_ = F.pad(taps_, (0, 0, 0, 1))                                  # tap kh * kw: zeros
    w = taps_.reshape(n, -1, cin).index_select(1, rows).view(n, ho * wo * cout, height * width * cin)
    return gemm(h.reshape(n, b, height * width * cin), w.transpose(1, 2), operands).view(n, b, ho, wo, cout)


def conv(h: torch.Tensor, weight: torch.Tensor, spec: Conv, operands: str | None = None,
         direct_ratio: float | None = None) -> torch.Tensor:
    """``h [N, B, H, W, C_in]`` (any strides) convolved per run with ``weight [N, C_out, C_in, k_h,
    k_w]``: im2col of the taps that meet pixels, then one GEMM (:func:`gemm`, ``operands`` its
    precision); ``[N, B, H_o, W_o, C_out]``. ``direct_ratio``: a lone run's convolutions of more than
    one tap whose output has at least this many positions per image per output channel run by the
    direct kernel instead (:func:`direct`; the module docstring)."""
    n, b, height, width, cin = h.shape
    cout, kh, kw = weight.shape[1], weight.shape[3], weight.shape[4]
    r0, rk, top, bottom, ho = taps(height, kh, spec.stride[0], spec.padding[0])
    c0, ck, left, right, wo = taps(width, kw, spec.stride[1], spec.padding[1])
    _check_output(ho, wo, kh, kw, spec, height, width)
    if runs_direct(kh * kw, ho * wo, cout, direct_ratio):
        return direct(h, weight, spec, operands)
    if dense_cheaper(height, width, rk * ck, h.is_cuda):
        return dense(h, weight, spec, operands)
    if top or bottom or left or right:
        h = F.pad(h, (0, 0, left, right, top, bottom))
    a = im2col(h, rk, ck, spec.stride, ho, wo)                                       # [N, M, K]
    if (rk, ck) != (kh, kw):
        weight = _KeptTaps.apply(weight, r0, rk, c0, ck)
    w = weight.permute(0, 3, 4, 2, 1).reshape(n, rk * ck * cin, cout)   # a view for channels-last weights
    return gemm(a, w, operands).view(n, b, ho, wo, cout)


def _one_batch_norm(x: torch.Tensor, params: dict, buffers: dict, spec: Norm, training: bool) -> torch.Tensor:
    """One run's BatchNorm of ``x [M, C]`` by torch's own kernel (``F.batch_norm``, one pass
    forward and one backward), with ``nn.BatchNorm2d``'s bookkeeping of ``num_batches_tracked``."""
    p = spec.prefix
    momentum, tracked = spec.momentum, buffers.get(f"{p}.num_batches_tracked")
    if training and tracked is not None:
        tracked.add_(1)
        if momentum is None:   # the cumulative average, as nn.BatchNorm2d computes its factor
            momentum = 1.0 / float(tracked)
    return F.batch_norm(x, buffers[f"{p}.running_mean"].squeeze(0), buffers[f"{p}.running_var"].squeeze(0),
                        params[f"{p}.weight"].squeeze(0), params[f"{p}.bias"].squeeze(0), training,
                        0.0 if momentum is None else momentum, spec.eps)


def batch_norm(h: torch.Tensor, params: dict, buffers: dict, spec: Norm, training: bool) -> torch.Tensor:
    """Per run and channel over ``(B, H, W)`` of ``h [N, B, H, W, C]`` (see the module docstring)."""
    n, c = h.shape[0], h.shape[-1]
    x = h.reshape(n, -1, c)
    xs = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if n == 1:
        return _one_batch_norm(xs.squeeze(0), params, buffers, spec, training).to(x.dtype).view(h.shape)
    p = spec.prefix
    running_mean, running_var = buffers[f"{p}.running_mean"], buffers[f"{p}.running_var"]
    if training:
        count = x.shape[1]
        if count == 1:   # torch's own refusal, at the same place
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"{list(h.shape[1:])} per run")
        var, mean = torch.var_mean(xs, dim=1, correction=0)                      # [N, C]
        with torch.no_grad():
            tracked = buffers.get(f"{p}.num_batches_tracked")
            if tracked is not None:
                tracked.add_(1)
            m = spec.momentum if spec.momentum is not None else \
                (1.0 / tracked.double()).to(running_mean.dtype)[:, None]
            running_mean.copy_(m * mean + (1 - m) * running_mean)
            running_var.copy_(m * (var * (count / (count - 1))) + (1 - m) * running_var)
    else:
        mean, var = running_mean, running_var
    scale = torch.rsqrt(var + spec.eps) * params[f"{p}.weight"]
    out = (xs - mean[:, None]) * scale[:, None] + params[f"{p}.bias"][:, None]
    return out.to(x.dtype).view(h.shape)


def max_pool(h: torch.Tensor, pool: dict) -> torch.Tensor:
    """``F.max_pool2d`` per run and image on ``[N, B, H, W, C]`` (a channels-last view, no copy)."""
    n, b, height, width, c = h.shape
    y = F.max_pool2d(h.reshape(n * b, height, width, c).permute(0, 3, 1, 2), **pool)
    return y.permute(0, 2, 3, 1).reshape(n, b, y.shape[2], y.shape[3], c)


def forward(plan_: Plan, params: dict, buffers: dict, x: torch.Tensor,
            training: bool | Mapping[str, bool], operands: str | None = None,
            direct_ratio: float | None = None) -> torch.Tensor:
    """Logits ``[N, B, K]`` of the N runs stored in ``params`` / ``buffers`` (stacked ``[N, ...]``,
    keyed by the model's ``state_dict`` names) on ``x [N, B, C, H, W]``. ``training``: one mode
    for every BatchNorm, or each BatchNorm's by its prefix (``{"bn1": True, ...}``); one in
    training mode updates its runs' running statistics in place. ``operands``: the convolution
    GEMMs' precision (:func:`gemm`); ``direct_ratio``: which of a lone run's convolutions run by the
    direct kernel (:func:`conv`)."""
    if x.dim() != 5:
        raise ValueError(f"mode='gemm' takes images [N, B, C, H, W]; got {tuple(x.shape)}")

    def cbn(h, c: Conv, bn: Norm):
        mode = training if isinstance(training, bool) else training[bn.prefix]
        return batch_norm(conv(h, params[c.weight], c, operands, direct_ratio), params, buffers, bn, mode)

    h = torch.relu(cbn(x.permute(0, 1, 3, 4, 2), plan_.stem, plan_.stem_bn))   # run-major NHWC view
    if plan_.pool is not None:
        h = max_pool(h, plan_.pool)
    for blk in plan_.blocks:
        out = cbn(torch.relu(cbn(h, blk.conv1, blk.bn1)), blk.conv2, blk.bn2)
        h = torch.relu(out + (h if blk.down is None else cbn(h, *blk.down)))
    feats = h.mean(dim=(2, 3))                                                     # [N, B, C]
    return torch.baddbmm(params[f"{plan_.fc}.bias"].unsqueeze(1), feats,
                         params[f"{plan_.fc}.weight"].transpose(1, 2))
