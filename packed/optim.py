r"""One SGD update for a whole pack: :class:`PackedSGD` (issue 17 item 2).

Why. On an H100 the 24 per-run ``torch.optim.SGD`` steps of a ResNet-18 pack took 15.8 of 53.7
kernel-ms per step (``results/packed_bench/gpu_h100/``): 24 x 62 small tensors, each its own
launch. The pack already stores every parameter stacked (``PackedModels.params[k]``, ``[N, ...]``)
and its gradient arrives stacked from the one backward, so the update can be a handful of
elementwise kernels per stacked tensor, whatever N is.

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
"""
from __future__ import annotations

import torch

from packed.model import PackedModels

#: the ``param_groups[0]`` keys :class:`PackedSGD` reads per run, in the order of its device rows
HYPER = ("lr", "momentum", "dampening", "weight_decay")


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


class PackedSGD:
    """``torch.optim.SGD``'s step for every run of ``packed`` at once (module docstring).

    Args:
        packed: the pack; its stacked ``params`` and their ``.grad`` are updated in place.
        optimizers: the runs' ``torch.optim.SGD`` objects (:func:`unsupported` must be "");
            they keep their hyperparameters, schedulers and checkpointed state.

    Example::

        >>> update = PackedSGD(packed, optimizers)
        >>> loss.backward(); update.step()          # all runs, one pass over the storage
    """

    def __init__(self, packed: PackedModels, optimizers: list) -> None:
        why = unsupported(packed, optimizers)
        if why:
            raise ValueError(f"PackedSGD cannot update this pack: {why}; step the runs' own optimizers")
        self.packed, self.optimizers = packed, list(optimizers)
        self.nesterov = bool(optimizers[0].param_groups[0]["nesterov"])
        self.host: tuple | None = None            # the hyperparameters last copied to the device
        self.hyper: torch.Tensor | None = None    # [len(HYPER), N] on the storage's device
        self.momentum: dict[str, torch.Tensor] = {}   # stacked momentum buffers, after step 1

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
        else:
            self.hyper.copy_(rows)
        self.host = values

    def baked(self) -> tuple:
        """The Python decisions a captured update freezes (everything else is on the device)."""
        return (self.nesterov, any(v[1] for v in self._values()), bool(self.momentum))

    @torch.no_grad()
    def step(self, frozen: torch.Tensor | None = None) -> None:
        """One update of every run; ``frozen`` (``[N]`` bool, or ``None`` when no run is frozen)
        marks the runs whose parameters and momentum must not change. Without frozen runs it is
        four fused kernels per stacked tensor (``addcmul``), whatever N is."""
        self.refresh()
        lr, mom, damp, wd = self.hyper
        neg_lr, keep_g = -lr, 1 - damp   # [N] each: tiny kernels, once per step
        with_momentum = any(v[1] for v in self._values())
        first = not self.momentum
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
        if first:
            self._share_state()

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
    buffer, and ``torch.save`` of a view writes its whole storage (all N runs')."""
    for state in state_dict["state"].values():
        if isinstance(state.get("momentum_buffer"), torch.Tensor):
            state["momentum_buffer"] = state["momentum_buffer"].clone()
    return state_dict
