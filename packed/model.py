r"""N independent copies of one network computed together: :func:`pack`, :func:`unpack`, :class:`PackedModels`.

Storage. Every parameter and buffer of the N models is stacked into one tensor ``[N, ...]``
(``PackedModels.params`` / ``.buffers``, keyed by the models' ``state_dict`` names). The packed
forward is ``torch.func.vmap`` of ``torch.func.functional_call`` over that storage and over the
inputs ``x [N, B, ...]`` on CUDA (``mode="vmap"``); on the CPU (``mode="loop"``, :data:`MODES`)
each model runs ``functional_call`` on its own rows of the storage, one after another, because
oneDNN's grouped convolutions are slower there than N plain ones (below); either way it returns
logits ``[N, B, K]`` and one backward serves the pack. ``PackedModels.models[i]`` is a true
copy of model ``i``'s class (a torchvision ResNet-18, the project's MLP) whose parameters and
buffers *alias* row ``i`` of the storage: its optimizer, gradient clipping, objective hooks
(PPD-SG's :math:`\alpha` reset calls ``model(x)`` in eval mode) and evaluation act on the packed
tensors through it, with the code ``train.py`` runs on a single model.

Why ``torch.func`` and not a hand-written grouped-convolution ResNet:

* One definition of the network. ``vmap`` runs ``models/resnet.py`` and ``models/mlp.py`` as they
  are (STYLE habit 10: no near-copy of torchvision's ResNet-18 that can drift from it); the
  stacked storage has the models' own ``state_dict`` keys, so packing and unpacking are plain
  ``stack`` / ``select``, bitwise, with no weight-layout conversion to get wrong.
* It is the grouped convolution anyway. ``vmap``'s rule for a convolution whose input and weight
  are both batched folds the model axis into channels and calls one convolution with
  ``groups=N``; BatchNorm's rule folds it into channels too (statistics per channel = per model);
  linear layers become one batched matmul. Nothing mixes the models: one model's NaN stays in
  its own channels. The price: activations keep the model axis in front (``[N, B, C, H, W]``),
  so each layer's rule moves it into the channels and back (a copy per layer), which a network
  written natively in the grouped layout ``[B, N*C, H, W]`` would not do. Measured on one CPU
  thread (``OMP_NUM_THREADS=1 python -m lpmetrics.packed.speed``; float32, N=4, CE + SGD step, a 2-core
  machine loaded by two other trainings): ResNet-18 32x32 batch 64, packed
  1005-1049 ms vs 775-786 ms for 4 separate steps (1.30-1.33x, two runs); MLP 1.23-1.32x.
  At larger N the grouped convolutions themselves cost more than N plain ones on the CPU
  (``python -m lpmetrics.packed.speed --profile``, N=8: backward 2.39 s vs 1.68 s, forward 0.76 s vs
  0.50 s; the layout copies are ~11 % of the extra), so the CPU ratio grows with N (1.40x at N=8,
  1.85x at N=24, ``results/packed_bench/``). On an H100 packing paid off from N=8 (0.66x) and
  N=24 (0.37x). Hence the CPU's ``loop`` mode: the per-model kernels behind the same storage and
  API (``results/packed_bench/cpu_loop_mode/``).
* BatchNorm running statistics are exact: the running mean / var / ``num_batches_tracked`` of all
  models are passed to ``functional_call`` stacked (``in_dims=0``), so the in-place momentum
  update inside ``vmap`` writes each model's own row, with the same formula as the single model
  (``tests/test_packed.py``: equal to separate runs up to the rounding of their inputs). ``vmap`` only fails on
  BatchNorm when the running statistics are *shared* (unbatched), which never happens here.
* Exactness: in float64 on the CPU two packed ResNet-18 steps match separate steps to 5e-14
  (grouped kernels sum in another order; nothing else differs); the MLP's match bitwise.

``mode="gemm"`` (:mod:`packed.gemm`) computes a torchvision ResNet-18's convolutions as batched
GEMMs over the runs instead of grouped convolutions, from the same storage (``PackError`` for
other architectures).

Limits: dropout (random, so no packed run could equal its separate twin; ``PackError``); all N
models must have the same class, state-dict keys, shapes, dtype and device (else ``PackError``
naming the model and key); ``PackedModels`` must not be moved with ``.to()`` after packing (the
per-model modules would stop aliasing the storage): move the models first, then pack.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call, vmap

from lpmetrics.packed import gemm


#: How the packed forward runs: ``vmap`` (one grouped computation: the GPU's mode), ``loop``
#: (each model on its own rows of the storage, one after another: the CPU's mode, where oneDNN's
#: grouped convolutions are slower than N plain ones), ``auto`` (vmap on CUDA, loop elsewhere).
#: ``gemm`` (torchvision ResNet-18/34 only: each convolution one batched GEMM over the runs,
#: :mod:`packed.gemm`; not chosen by ``auto``). ``streams``: ``loop``'s per-model kernels, each
#: model's on its own CUDA stream (they overlap; one CUDA graph captures them all), with each
#: model's batch in the layout a lone run feeds it (:meth:`PackedModels._streams`): the exact
#: fallback, equal to lone runs bit for bit; on the CPU it runs the models one after another.
#: All write the same storage and share one backward.
MODES = ("auto", "vmap", "loop", "gemm", "streams")


class PackError(ValueError):
    """The models cannot share a pack (architecture, shapes, dtype, device, randomness)."""


def _check_packable(models: list[nn.Module]) -> None:
    if not models:
        raise PackError("pack() needs at least one model; got an empty list")
    first = models[0].state_dict()
    for i, model in enumerate(models):
        if type(model) is not type(models[0]):
            raise PackError(f"model {i} is a {type(model).__name__}, model 0 a "
                            f"{type(models[0]).__name__}: a pack holds one architecture; "
                            "split the runs into one pack per model config")
        for m in model.modules():
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
                raise PackError(f"model {i} has dropout p={m.p}: random masks cannot match the "
                                "separate run's; pack models with dropout=0 (model.dropout=0)")
        state = model.state_dict()
        if list(state) != list(first):
            extra = sorted(set(state) ^ set(first))
            raise PackError(f"model {i} has other state-dict keys than model 0 ({extra[:3]}...): "
                            "same architecture needed (e.g. same cifar_stem, hidden widths)")
        for key, value in state.items():
            ref = first[key]
            if value.shape != ref.shape or value.dtype != ref.dtype or value.device != ref.device:
                raise PackError(f"model {i} key {key!r}: {tuple(value.shape)} {value.dtype} "
                                f"{value.device} vs model 0's {tuple(ref.shape)} {ref.dtype} "
                                f"{ref.device}; same input shape / num_classes / dtype / device "
                                "needed: split these runs into separate packs")


def _alias(module: nn.Module, name: str, tensor: torch.Tensor, parameter: bool) -> None:
    """Replace ``module``'s parameter / buffer ``name`` by ``tensor`` (a view of the storage)."""
    *path, leaf = name.split(".")
    owner = module.get_submodule(".".join(path)) if path else module
    if parameter:
        # nn.Parameter(view) shares the view's memory: in-place optimizer updates land in storage
        setattr(owner, leaf, nn.Parameter(tensor, requires_grad=True))
    else:
        owner._buffers[leaf] = tensor


def _own_storage(module, state_dict, prefix, local_metadata) -> None:
    """State-dict hook of a packed model: its tensors are rows of the stacked storage, and
    ``torch.save`` keeps a view's whole storage (a run's checkpoint would hold all N models), so
    they are handed out as copies; ``keep_vars=True`` (the live Parameters) is left alone."""
    for k, v in state_dict.items():
        if k.startswith(prefix) and isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter):
            state_dict[k] = v.clone()


class _Float32BatchNorm(torch.overrides.TorchFunctionMode):
    """Under autocast, BatchNorm of the packed forward runs in float32 (input cast up, output
    cast back to the input's dtype). vmap's BatchNorm rule calls the native kernel, which on
    CUDA refuses a bf16 input with float32 running statistics ("Expected running_mean to have
    type BFloat16 but got Float", H100, torch 2.11: ``results/packed_bench/gpu_h100/``); a
    single model's cuDNN BatchNorm takes that mix. The statistics stay float32, as alone."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.batch_norm and args and args[0].dtype in (torch.float16, torch.bfloat16):
            dtype = args[0].dtype
            return func(args[0].float(), *args[1:], **kwargs).to(dtype)
        return func(*args, **kwargs)


class PackedModels:
    """N models of one architecture, stored stacked and computed in one ``vmap`` call.

    Build with :func:`pack`; read back with :func:`unpack`. ``packed(x)`` with ``x [N, B, ...]``
    returns logits ``[N, B, K]``; in training mode BatchNorm updates each model's own running
    statistics. ``packed.models[i]`` is model ``i`` as an ordinary module (sharing the storage).

    Example::

        >>> from models.mlp import MLP
        >>> packed = pack([MLP(2, [4], hidden=[8]) for _ in range(3)])
        >>> packed(torch.randn(3, 5, 4)).shape
        torch.Size([3, 5, 2])
        >>> len(unpack(packed))
        3
    """

    def __init__(self, models: list[nn.Module], mode: str = "auto") -> None:
        _check_packable(models)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
        self.n, self.mode = len(models), mode
        states = [m.state_dict(keep_vars=True) for m in models]
        param_names = [name for name, _ in models[0].named_parameters()]
        buffer_names = [name for name, _ in models[0].named_buffers()]
        with torch.no_grad():
            self.params = {k: torch.stack([s[k].detach() for s in states]).requires_grad_()
                           for k in param_names}
            self.buffers = {k: torch.stack([s[k].detach() for s in states]) for k in buffer_names}
        # the skeleton only supplies the forward code: functional_call swaps in every tensor
        self._skeleton = copy.deepcopy(models[0]).to("meta")
        self.models = []
        for i, model in enumerate(models):
            view = copy.deepcopy(model).to("meta")
            for k in param_names:
                _alias(view, k, self.params[k].detach()[i], parameter=True)
            for k in buffer_names:
                _alias(view, k, self.buffers[k][i], parameter=False)
            view.train(model.training)
            view._register_state_dict_hook(_own_storage)
            self.models.append(view)
        self._skeleton.train(models[0].training)
        self._gemm_plan = self._plan_gemm() if mode == "gemm" else None
        self._streams_of = None   # (device, [stream per model]) once mode="streams" runs on CUDA

    def _plan_gemm(self) -> gemm.Plan:
        try:
            return gemm.plan(self._skeleton)
        except gemm.GemmPlanError as exc:
            raise PackError(str(exc)) from exc

    @property
    def training(self) -> bool:
        return self._skeleton.training

    def train(self, mode: bool = True) -> "PackedModels":
        self._skeleton.train(mode)
        for m in self.models:
            m.train(mode)
        return self

    def eval(self) -> "PackedModels":
        return self.train(False)

    def _one(self, params, buffers, x):
        return functional_call(self._skeleton, (params, buffers), (x,), strict=True)

    def _loop(self, x: torch.Tensor) -> torch.Tensor:
        """The models one after another on their rows of the storage (the CPU's mode). The rows
        come from ``unbind`` (one backward node per stacked tensor, which stacks the N row
        gradients once), not from ``v[i]``: each of those would scatter its gradient into a
        zero tensor of the whole stack, N times the parameter memory per model."""
        params = {k: v.unbind(0) for k, v in self.params.items()}
        return torch.stack([self._model(params, i, x[i]) for i in range(self.n)])

    def _model(self, params: dict, i: int, x: torch.Tensor) -> torch.Tensor:
        """Model ``i`` on its rows: ``params`` the storage's ``unbind(0)``s, the buffers' rows."""
        return self._one({k: rows[i] for k, rows in params.items()},
                         {k: v[i] for k, v in self.buffers.items()}, x)

    def _stream_pool(self, device: torch.device) -> list:
        """One side stream per model on ``device``, made once (a CUDA graph replays on them)."""
        if self._streams_of is None or self._streams_of[0] != device:
            self._streams_of = (device, [torch.cuda.Stream(device=device) for _ in range(self.n)])
        return self._streams_of[1]

    def _streams(self, x: torch.Tensor) -> torch.Tensor:
        """Model ``i``'s forward on stream ``i`` (``mode="streams"``): the kernels of a lone run.

        Inputs: an image batch ``[B, C, H, W]`` goes in channels-last, the layout in which a lone
        run receives it (the image datasets store NHWC and hand out batch views,
        :mod:`data.datasets`; the pack stacks them contiguous, :func:`packed.launch._draw`), so
        every convolution is the lone run's; ``loop`` feeds the contiguous rows and differs
        from lone runs by rounding on images. Streams: each side stream first waits for the
        current one (the input and the parameters are ready), runs its model, and the current
        stream waits for all of them before the logits are stacked; autograd runs each
        backward kernel on its forward's stream, so the backward overlaps the same way. The same
        fork and join is what CUDA graph capture needs of side streams."""
        params = {k: v.unbind(0) for k, v in self.params.items()}

        def one(i):   # the layout copy is made on the stream that reads it (and saves it for backward)
            row = x[i].contiguous(memory_format=torch.channels_last) if x.dim() == 5 else x[i]
            return self._model(params, i, row)
        if x.device.type != "cuda":
            return torch.stack([one(i) for i in range(self.n)])
        current, sides = torch.cuda.current_stream(x.device), self._stream_pool(x.device)
        outs = []
        for i, side in enumerate(sides):
            side.wait_stream(current)
            with torch.cuda.stream(side):
                outs.append(one(i))
        for side, out in zip(sides, outs):
            current.wait_stream(side)
            out.record_stream(current)   # made on ``side``, read and freed on ``current``
        return torch.stack(outs)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[0] != self.n:
            raise ValueError(f"packed input must be [N={self.n}, B, ...] (one batch per model); "
                             f"got {tuple(x.shape)}")
        mode = self.mode if self.mode != "auto" else ("vmap" if x.device.type == "cuda" else "loop")
        if mode == "loop":
            return self._loop(x)
        if mode == "streams":
            return self._streams(x)
        if mode == "gemm":   # the mode may be set after packing (a benchmark times each in turn)
            if self._gemm_plan is None:
                self._gemm_plan = self._plan_gemm()
            return gemm.forward(self._gemm_plan, self.params, self.buffers, x, self.training)
        if torch.is_autocast_enabled(x.device.type):
            with _Float32BatchNorm():
                return vmap(self._one)(self.params, self.buffers, x)
        return vmap(self._one)(self.params, self.buffers, x)

    def grads_to_models(self) -> None:
        """Point each model's ``param.grad`` at its row of the stacked gradient (views: an
        in-place clip on a model's grads clips the stored rows)."""
        for k, stacked in self.params.items():
            for i, model in enumerate(self.models):
                p = model.get_parameter(k)
                p.grad = None if stacked.grad is None else stacked.grad[i]

    def zero_grad(self) -> None:
        for stacked in self.params.values():
            stacked.grad = None
        for model in self.models:
            model.zero_grad(set_to_none=True)


def pack(models: list[nn.Module], mode: str = "auto") -> PackedModels:
    """Stack ``models`` (same architecture, dtype and device) into one :class:`PackedModels`.

    The models themselves are left untouched (their tensors are copied into the storage).
    ``mode``: see :data:`MODES`."""
    return PackedModels(list(models), mode)


def unpack(packed: PackedModels) -> list[dict[str, torch.Tensor]]:
    """The ``state_dict`` of each packed model (cloned tensors, keys in the model's order)."""
    return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in packed.models]
