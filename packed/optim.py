r"""One SGD update for a whole pack: :class:`PackedSGD`.

Why. On an H100 the 24 per-run ``torch.optim.SGD`` steps of a ResNet-18 pack took 15.8 of 53.7
kernel-ms per step (``results/packed_bench/gpu_h100/``): 24 x 62 small tensors, each its own
launch. The pack already stores every parameter stacked (``PackedModels.params[k]``, ``[N, ...]``)
and its gradient arrives stacked from the one backward, so the update can be a handful of
elementwise kernels per stacked tensor, whatever N is; or one (``fused``, below).

The update of ``torch.optim.SGD`` (``maximize=False``), run by run, with run ``i``'s
hyperparameters as ``[N]`` device tensors broadcast over each stacked tensor:

.. math::

    g_i \leftarrow g_i + \lambda_i \theta_i, \qquad
    b_i \leftarrow \begin{cases} g_i & \text{first step} \\
                                 \mu_i b_i + (1 - \tau_i) g_i & \text{else} \end{cases}, \qquad
    \theta_i \leftarrow \theta_i - \eta_i\,(\text{nesterov} ? g_i + \mu_i b_i : b_i).

The learning rates live in a device tensor refreshed from the runs' own optimizers (where their
schedulers keep changing ``param_groups[0]["lr"]``) before each step: a host-to-device copy when
something changed, never a device-to-host read, so an lr milestone needs no new CUDA graph
(:mod:`packed.graph`). The per-run optimizers stay the owners of the hyperparameters and of the
state a checkpoint saves: after the first update each one's ``momentum_buffer`` is a view of its
row of the stacked buffer, so ``optimizer.state_dict()`` holds what ``train.py``'s would.

Frozen runs (:attr:`packed.PackedStep.divergences`) keep their parameters and momentum exactly
(a ``where`` on the host-known frozen mask). Exactness: float64 on the CPU, equal to N
``torch.optim.SGD`` steps to 1e-10 (``tests/test_packed_capture.py``; the fused ``add(alpha=)``
of ``torch.optim.SGD`` and the broadcast product here round differently, by an ulp).

One pass per stacked tensor (``fused``). The eager update reads and writes each stacked tensor in
three or four kernels (``addcmul`` for the weight decay, the momentum, nesterov's step, the
parameter). ``PackedSGD(..., fused=True)`` computes the same formula, with the same operations in
the same order, as one ``torch.compile``'d function over all stacked tensors (:func:`_one_pass`):
Inductor fuses each tensor's chain into one loop that reads ``theta, g, b`` and the ``[N]`` rows
of ``lr, mu, tau, lambda`` and writes ``theta, b`` (at most one kernel per tensor; the CPU backend
puts them all in one), frozen runs by a ``where`` in the same loop, so one compiled function
serves every step after the first. The first step, which creates the momentum buffers, stays
eager. The buffers are written in place, so the per-run ``momentum_buffer`` views and the
checkpoints are unchanged. ``fused="auto"`` falls back to the eager kernels where compiling fails
(no compiler, no Triton), keeping the reason in :attr:`PackedSGD.fused_note`; ``fused=True``
raises instead. Compiling costs 5-60 s per variant (momentum or not) and process on this CPU
(Inductor's cache warm or cold). A CUDA-graph capture must not be the compiled function's first
call (compiling and loading kernels is not capturable): a step captured before it has run keeps
the eager kernels (correct, not faster; :meth:`PackedSGD.baked` records which), so capture after
two eager steps (buffers, then compile), as :class:`packed.graph.GraphedStep`'s default three
warm-up steps do.

Measured (torch 2.14.1, x86 CPU). Float64 (``tests/test_packed_onepass_sgd.py``): equal to the
eager update to 3.2e-16 relative over six steps (first-step buffer init, momentum 0 and
dampening, nesterov, weight decay, lr changes between steps; a frozen run kept bit for bit); not
bitwise, because ATen's CPU ``addcmul`` rounds ``self + t1 * t2`` once (its build contracts it
into an FMA) and Inductor's C++ rounds the product first. On CUDA Inductor's ``addcmul`` is
written to round as ATen's; whether the whole update is then bitwise is not measured yet. Time of
a ResNet-18 pack of 4's update, float32, one thread of a 2-core CPU shared with other trainings
(``python -m lpmetrics.packed.optim``, min-median of 10 steps): 143-154 ms eager, 58-63 ms one pass (a
more loaded run: 301-384 and 51-80 ms), parameters 2e-7 apart (relative) after 12 steps. Until a
GPU has measured speed and rounding, the default stays the eager update (``fused=False``).
"""
from __future__ import annotations

import torch

from lpmetrics.packed.model import PackedModels

#: the ``param_groups[0]`` keys :class:`PackedSGD` reads per run, in the order of its device rows
HYPER = ("lr", "momentum", "dampening", "weight_decay")
#: values of ``PackedSGD(fused=)``: the eager kernels, the one pass (raising where it cannot be
#: compiled), or the one pass where it compiles and the eager kernels otherwise
FUSED = (False, True, "auto")


def unsupported(packed: PackedModels, optimizers: list) -> str:
    """Why :class:`PackedSGD` cannot replace ``optimizers`` ("" if it can): each must be a plain
    ``torch.optim.SGD`` with one parameter group holding exactly its model's parameters in the
    storage's order (no objective parameters), no ``maximize``, and one ``nesterov`` for all."""
    keys = list(packed.params)
    for i, opt in enumerate(optimizers):
        if type(opt) is not torch.optim.SGD:
            return f"run {i}'s optimizer is {type(opt).__name__}, not torch.optim.SGD"
        if len(opt.param_groups) != 1:
            return f"run {i}'s optimizer has {len(opt.param_groups)} parameter groups (objective parameters)"
        group = opt.param_groups[0]
        mine = [packed.models[i].get_parameter(k) for k in keys]
        if len(group["params"]) != len(mine) or any(p is not q for p, q in zip(group["params"], mine)):
            return f"run {i}'s optimizer does not hold exactly its model's parameters"
        if group.get("maximize") or group.get("differentiable"):
            return f"run {i}'s SGD has maximize/differentiable set"
        if group["nesterov"] != optimizers[0].param_groups[0]["nesterov"]:
            return "the runs differ in nesterov"
    return ""


def _one_pass(params: list, grads: list, bufs: list, hyper: torch.Tensor, frozen: torch.Tensor,
              with_momentum: bool, nesterov: bool) -> None:
    """The update of every stacked tensor after the first step, in place, with
    :meth:`PackedSGD._kernels`' operations in its order (compiled by :class:`PackedSGD` into one
    kernel per tensor). ``bufs`` is ignored without momentum; ``frozen`` ``[N]`` bool."""
    lr, mom, damp, wd = hyper.unbind(0)
    neg_lr, keep_g = -lr, 1 - damp
    for p, g, buf in zip(params, grads, bufs if with_momentum else params):
        b = (p.shape[0],) + (1,) * (p.dim() - 1)
        keep = frozen.view(b)
        d = torch.addcmul(g, wd.view(b), p)
        if with_momentum:
            buf.copy_(torch.where(keep, buf, torch.addcmul(buf * mom.view(b), d, keep_g.view(b))))
            d = torch.addcmul(d, mom.view(b), buf) if nesterov else buf
        p.copy_(torch.where(keep, p, torch.addcmul(p, d, neg_lr.view(b))))


class PackedSGD:
    """``torch.optim.SGD``'s step for every run of ``packed`` at once (module docstring).

    Args:
        packed: the pack; its stacked ``params`` and their ``.grad`` are updated in place.
        optimizers: the runs' ``torch.optim.SGD`` objects (:func:`unsupported` must be "");
            they keep their hyperparameters, schedulers and checkpointed state.
        fused: ``False`` (default): three or four elementwise kernels per stacked tensor;
            ``True``: one compiled pass per stacked tensor from the second step on (raises
            where it cannot be compiled); ``"auto"``: the one pass where it compiles, else the
            kernels (:attr:`fused_note` says which and why).

    Example::

        >>> update = PackedSGD(packed, optimizers)
        >>> loss.backward(); update.step()          # all runs, one pass over the storage
    """

    def __init__(self, packed: PackedModels, optimizers: list, fused: bool | str = False) -> None:
        why = unsupported(packed, optimizers)
        if why:
            raise ValueError(f"PackedSGD cannot update this pack: {why}; step the runs' own optimizers")
        if not (isinstance(fused, bool) or fused == "auto"):
            raise ValueError(f"fused={fused!r}: give one of {FUSED} (False = the eager kernels)")
        self.packed, self.optimizers = packed, list(optimizers)
        self.nesterov = bool(optimizers[0].param_groups[0]["nesterov"])
        self.host: tuple | None = None            # the hyperparameters last copied to the device
        self.hyper: torch.Tensor | None = None    # [len(HYPER), N] on the storage's device
        self.no_frozen: torch.Tensor | None = None   # [N] False: the one pass's mask without frozen runs
        self.momentum: dict[str, torch.Tensor] = {}   # stacked momentum buffers, after step 1
        self.fused = fused
        #: which update runs: "kernels", "one pass", or why the one pass fell back
        self.fused_note = "one pass (not compiled yet)" if fused else "kernels"
        self._compiled = None   # torch.compile(_one_pass), made at the first one-pass step
        self._failed = False    # it did not compile ("auto"): the kernels from then on
        self._ready: set = set()   # the (momentum?) variants the compiled pass has run once

    def _values(self) -> tuple:
        groups = [opt.param_groups[0] for opt in self.optimizers]
        # torch.optim.SGD ignores dampening without momentum (its buffer is then the gradient)
        return tuple((g["lr"], g["momentum"], g["dampening"] if g["momentum"] else 0.0, g["weight_decay"])
                     for g in groups)

    def refresh(self) -> None:
        """Copy the runs' hyperparameters to the device if they changed (host-to-device only).
        Call it outside a CUDA-graph capture: the copy writes into the same device tensor, so a
        graph captured earlier reads the new values on its next replay."""
        values = self._values()
        if values == self.host:
            return
        stacked = next(iter(self.packed.params.values()))
        rows = torch.tensor(values, dtype=stacked.dtype).T.contiguous()
        if self.hyper is None:
            self.hyper = rows.to(stacked.device)
            self.no_frozen = torch.zeros(len(values), dtype=torch.bool, device=stacked.device)
        else:
            self.hyper.copy_(rows)
        self.host = values

    def baked(self) -> tuple:
        """The Python decisions a captured update freezes (everything else is on the device):
        nesterov, momentum, whether the buffers exist, and whether the one pass is ready."""
        with_momentum = any(v[1] for v in self._values())
        return (self.nesterov, with_momentum, bool(self.momentum), with_momentum in self._ready)

    @torch.no_grad()
    def step(self, frozen: torch.Tensor | None = None) -> None:
        """One update of every run; ``frozen`` (``[N]`` bool, or ``None`` when no run is frozen)
        marks the runs whose parameters and momentum must not change."""
        self.refresh()
        with_momentum = any(v[1] for v in self._values())
        first = not self.momentum   # always, without momentum (no buffers)
        if (with_momentum and first) or not self._one_pass(frozen, with_momentum):
            self._kernels(frozen, with_momentum, first)
        if first:
            self._share_state()

    def _one_pass(self, frozen: torch.Tensor | None, with_momentum: bool) -> bool:
        """The compiled update (``fused``); ``False`` where the eager kernels must run instead:
        not asked for, fallen back, or a CUDA-graph capture before the first compiled call."""
        if not self.fused or self._failed:
            return False
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if capturing and with_momentum not in self._ready:
            return False   # compiling and loading kernels are not capturable: eager this time
        keys = [k for k, p in self.packed.params.items() if p.grad is not None]
        params = [self.packed.params[k] for k in keys]
        try:
            if self._compiled is None:
                self._compiled = torch.compile(_one_pass, fullgraph=True)
            self._compiled(params, [p.grad for p in params],
                           [self.momentum[k] for k in keys] if with_momentum else [],
                           self.hyper, self.no_frozen if frozen is None else frozen,
                           with_momentum, self.nesterov)
        except Exception as err:   # noqa: BLE001 -- a compiler's failure, whatever its type
            if self.fused is True:
                raise RuntimeError(f"PackedSGD(fused=True): the one-pass update did not compile "
                                   f"({type(err).__name__}: {err}); use fused='auto' to fall back "
                                   "to the eager kernels") from err
            self._failed = True
            self.fused_note = f"kernels (the one pass did not compile: {type(err).__name__}: {err})"
            return False
        self._ready.add(with_momentum)
        self.fused_note = "one pass"
        return True

    def _kernels(self, frozen: torch.Tensor | None, with_momentum: bool, first: bool) -> None:
        """The eager update: four fused kernels per stacked tensor without frozen runs
        (``addcmul``), whatever N is; the first step's buffer init."""
        lr, mom, damp, wd = self.hyper
        neg_lr, keep_g = -lr, 1 - damp   # [N] each: tiny kernels, once per step
        for k, p in self.packed.params.items():
            g = p.grad
            if g is None:   # no run used this parameter (torch.optim.SGD skips it too)
                continue
            b = (p.shape[0],) + (1,) * (p.dim() - 1)
            keep = None if frozen is None else frozen.view(b)
            d = torch.addcmul(g, wd.view(b), p)                      # g + wd * p
            if with_momentum:
                if first:
                    buf = self.momentum[k] = d.clone()
                elif keep is None:
                    buf = self.momentum[k].mul_(mom.view(b)).addcmul_(d, keep_g.view(b))
                else:
                    buf = self.momentum[k]
                    buf.copy_(torch.where(keep, buf, torch.addcmul(buf * mom.view(b), d, keep_g.view(b))))
                d = torch.addcmul(d, mom.view(b), buf) if self.nesterov else buf
            if keep is None:
                p.addcmul_(d, neg_lr.view(b))                        # p - lr * d
            else:
                p.copy_(torch.where(keep, p, torch.addcmul(p, d, neg_lr.view(b))))

    def _share_state(self) -> None:
        """Each run's ``momentum_buffer`` becomes a view of its row of the stacked buffer, so its
        optimizer's ``state_dict()`` (the checkpoint) is the state a lone run would have; and
        each optimizer is marked as stepped (the flag its ``step()`` sets for the lr scheduler's
        "scheduler.step() before optimizer.step()" check)."""
        for i, opt in enumerate(self.optimizers):
            opt._opt_called = True
            if not opt.param_groups[0]["momentum"]:
                continue   # torch.optim.SGD keeps no buffer without momentum
            for k, buf in self.momentum.items():
                opt.state[self.packed.models[i].get_parameter(k)]["momentum_buffer"] = buf[i]
            opt.register_state_dict_post_hook(_own_buffers)


def _own_buffers(optimizer, state_dict: dict) -> dict:
    """The momentum buffers of a saved optimizer state as copies: each is a row of the stacked
    buffer, and ``torch.save`` of a view writes its whole storage (all N runs'). New per-parameter
    dicts: ``Optimizer.state_dict()`` hands out the live ``optimizer.state`` dicts themselves, and
    replacing the view in those would cut the run's state off the stacked buffer (every later
    checkpoint would save the momentum of the first one)."""
    state_dict["state"] = {
        k: {**s, "momentum_buffer": s["momentum_buffer"].clone()}
        if isinstance(s.get("momentum_buffer"), torch.Tensor) else s
        for k, s in state_dict["state"].items()}
    return state_dict


def main(argv: list[str] | None = None) -> dict:
    """``python -m lpmetrics.packed.optim [--n 4] [--device cpu] [--steps 10]``: the update of a ResNet-18
    pack (momentum 0.9, weight decay 5e-4, random gradients), eager and one pass side by side:
    median and min ms per step (the compiling step apart) and the largest relative difference."""
    import argparse
    import statistics
    import time

    from lpmetrics.models.resnet import resnet18
    from lpmetrics.packed.model import pack

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    device, row = torch.device(args.device), {"n": args.n, "device": args.device}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    params = {}
    for fused in (False, True):
        torch.manual_seed(0)
        packed = pack([resnet18(2, [3, 32, 32]).to(device) for _ in range(args.n)])
        update = PackedSGD(packed, [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
                                    for m in packed.models], fused=fused)
        ms, g = [], torch.Generator(device=device).manual_seed(1)
        for step in range(args.steps + 2):
            for p in packed.params.values():
                p.grad = torch.randn(p.shape, generator=g, device=device)
            sync()
            t0 = time.perf_counter()
            update.step()
            sync()
            ms.append(1000 * (time.perf_counter() - t0))
        name = "one_pass" if fused else "eager"
        row |= {f"{name}_ms_median": statistics.median(ms[2:]), f"{name}_ms_min": min(ms[2:]),
                f"{name}_second_step_ms": ms[1], f"{name}_note": update.fused_note}
        params[name] = {k: p.detach() for k, p in packed.params.items()}
    row["max_rel_diff"] = max(float((params["one_pass"][k] - p).abs().max()) / max(1.0, float(p.abs().max()))
                              for k, p in params["eager"].items())
    print(row)
    return row


if __name__ == "__main__":
    main()
