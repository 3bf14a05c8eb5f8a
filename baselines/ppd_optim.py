r"""PPD-SG and PPD-AdaGrad: stage-wise proximal primal-dual optimizers (Liu et al., ICLR 2020).

Paper: M. Liu, Z. Yuan, Y. Ying, T. Yang, *Stochastic AUC Maximization with Deep Neural
Networks*, ICLR 2020 (arXiv:1908.10831), Algorithm 1 (PPD-SG) with its inner primal-dual SGD
loop, and Algorithm 3 (PPD-AdaGrad) with its AdaGrad inner loop.  Pair with the objective
:class:`baselines.ppd.SquareAUCMinMax` (primal :math:`v = (w, a, b)`, dual :math:`\alpha`).

Stage :math:`k = 1, 2, \dots` runs :math:`T_k = T_0\,3^{k-1}` steps with step size
:math:`\eta_k = \eta_0 / 3^{k-1}` on the proximally regularised saddle problem around the
reference point :math:`v_{k-1}` (the previous stage's output, :math:`v_0` = the initial weights):

.. math::

    \min_v \max_\alpha\; F(v, \alpha) + \frac{1}{2\gamma}\lVert v - v_{k-1}\rVert^2 .

PPD-SG inner step (stochastic gradients :math:`g_v, g_\alpha` of :math:`F` on the batch):

.. math::

    v_{t+1} = v_t - \eta_k\big(g_v + \tfrac1\gamma (v_t - v_{k-1})\big), \qquad
    \alpha_{t+1} = \alpha_t + \eta_k\, g_\alpha .

PPD-AdaGrad inner step (composite-mirror-descent AdaGrad of Duchi et al. 2011, proximal term in
closed form; :math:`s_t = \sqrt{\sum_{\tau\le t} g_\tau^2}` per coordinate, reset every stage):

.. math::

    v_{t+1} = \frac{H_t v_t - \eta_k g_v + \frac{\eta_k}{\gamma} v_{k-1}}
                   {H_t + \frac{\eta_k}{\gamma}}, \quad H_t = \delta + s_t, \qquad
    \alpha_{t+1} = \alpha_t + \eta_k\, g_\alpha / (\delta + s_t) .

At a stage end every parameter is replaced by its stage average :math:`\bar v_k = \frac1{T_k}
\sum_t v_t` (``average=True``), which becomes the next reference point; ``stage_ended`` is set so
the objective resets :math:`\alpha_k` from fresh samples (Algorithm 1, line 4).

The step size lives in ``group["lr"]`` and is divided by 3 in place at each stage end, so loggers
see it; run with ``scheduler.milestones=[]`` or the trainer's MultiStepLR decays it on top.

Deliberate deviations:

* PPD-AdaGrad's stage length is the geometric :math:`T_k = T_0 3^{k-1}`, not the paper's
  adaptive rule (stop once :math:`t` exceeds a multiple of the accumulated gradient norms);
  with the geometric rule both optimizers share one stage schedule and one budget.
* Weight decay (``weight_decay``) is added to :math:`g_v` of the model's parameters so the
  baseline matches the other runs' regularisation; the paper uses only the proximal term
  (set ``weight_decay=0`` for that).  Objective groups carry their own ``weight_decay: 0``.
* BatchNorm buffers are not averaged (they are not parameters): the model keeps its running
  statistics of the last iterates.
* Against Liu et al.'s official code (github.com/yzhuoning/DeepAUC at e7cc490, TensorFlow:
  ``optimizer.py`` and ``PPD_SG.py`` / ``PPD_AdaGrad.py``; read, not copied):

  - AdaGrad's offset :math:`\delta` is their ``epsilon = 0.5`` (our default since the queue of
    the paper's regime). With :math:`\delta \approx 0` a stage's first step is about
    :math:`\eta_k\,\mathrm{sign}(g)` on every coordinate, the size of the initial weights at
    :math:`\eta_0 = 0.1`.
  - Their AdaGrad inner loop is the dual-averaging form, :math:`v = v_{k-1} - \eta_k G_t /
    (\sqrt{S_t} + \delta)` with :math:`G_t, S_t` the stage's sums of (proximal) gradients and
    their squares, every iterate anchored at the reference point; ours is the composite mirror
    descent form above, each step taken from the last iterate.
  - Stage restarts: their PPD-SG (``PPD_SG.py``) continues each stage from its last iterate and
    uses the stage average only as the next reference point and to reset :math:`\alpha`; their
    PPD-AdaGrad's iterates are anchored at that average. Ours start every stage at the average
    (``average=True``), for both; ``average=False`` continues from the last iterate but then also
    makes it the reference point, so neither option is their PPD-SG's mix.
  - Restart point: they evaluate :math:`\alpha`'s reset at the stage average with
    :math:`\min(3^k, n/B)` fresh batches (:math:`3^k \cdot 128` examples); we re-score a fixed
    ``alpha_samples`` (1,024 examples, :class:`baselines.ppd.SquareAUCMinMax`).
  - Their stages are :math:`T_k = T_0 \sqrt{9}^{\,k-1}` with :math:`T_0 = 200`, :math:`\gamma = 2000`,
    batch 128, ResNet-20 with ELU; ours share the LP runs' network and batch, with
    :math:`T_0 = 2000` (the LP authors' stage length) and :math:`\gamma = 500`, the default of
    LibAUC's PESG (Yuan et al. 2021, the same group's successor of PPD-SG: ``gamma=500``, later
    ``epoch_decay=2e-3``), where their PPD-SG and PPD-AdaGrad scripts hard-code :math:`\gamma = 2000`.
  - Their PPD-AdaGrad updates :math:`\alpha` like the primal variables, with a proximal pull
    towards 0 and anchored at 0 (its reference in ``V0`` is ``0``; the branch meant to drop its
    proximal term is overwritten by the next line), so the stage's reset of :math:`\alpha` is
    lost after the stage's first step; ours ascends from the reset value, as the paper's
    Algorithm 3 does.
  - Neither their scripts nor the paper's regime (``configs/regime/paper.yaml``) use L2 or
    augmentation (``use_L2 False``, ``is_crop_flip False``).

A side effect of averaging at stage ends: with :math:`T_0 = 2000` the stages end at steps 2k, 8k
and 26k, which are evaluation steps (every 1,000), so those three evaluations see the averaged
weights with the running BatchNorm statistics of the last iterates (BatchNorm's momentum 0.1
refits them within the next few dozen steps). Later evaluations, and the 40k one the tables
report, are not affected; a best-validation pick at one of those three steps is.

In packs and CUDA graphs (:mod:`packed.graph`). ``step()`` makes no host sync, and its one host
decision, the stage end, is a function of the step count: :meth:`needs_host` names the steps that
end a stage (a pack runs those eagerly, every other step replays one captured graph), and
:meth:`sync_clock` sets the host counters after a replay, which runs no Python. Everything a step
changes between stage ends (parameters, reference points, stage sums, AdaGrad accumulators) is
device tensors updated in place, so a replay updates it as the eager step would.
"""
from __future__ import annotations

import torch
from torch.optim import Optimizer


class _StagewiseProximalPrimalDual(Optimizer):
    """Shared stage logic: proximal reference, stage averaging, :math:`T_k, \\eta_k` schedule."""

    handles_ascent = True  # the objective checks this before relying on ``ascent`` groups
    graph_safe = True      # packed.graph may capture step(): see the module docstring

    def __init__(self, params, lr: float, gamma: float, T0: int, weight_decay: float,
                 average: bool, **extra) -> None:
        if lr <= 0 or gamma <= 0 or int(T0) < 1:
            raise ValueError(f"need lr > 0, gamma > 0 and T0 >= 1; got lr={lr}, gamma={gamma}, "
                             f"T0={T0}")
        defaults = dict(lr=lr, gamma=gamma, weight_decay=weight_decay, ascent=False, **extra)
        super().__init__(params, defaults)
        self.T0, self.average = int(T0), bool(average)
        self.stage, self.stage_step, self.stage_len = 1, 0, int(T0)
        self.stage_ended = False

    def _update(self, p: torch.Tensor, g: torch.Tensor, state: dict, group: dict) -> None:
        raise NotImplementedError

    def _clock(self, steps: int) -> tuple[int, int, int]:
        """(stage, stage_step, stage_len) after ``steps`` steps from the first: stages of
        ``T0 * 3**(k-1)`` steps, the same arithmetic :meth:`step` does one step at a time."""
        stage, length = 1, self.T0
        while steps >= length:
            steps, stage, length = steps - length, stage + 1, length * 3
        return stage, steps, length

    def needs_host(self, steps: int) -> bool:
        """Whether the step taken after ``steps`` steps ends a stage (averaging, ``lr / 3``, the
        objective's alpha reset): a decision a captured graph of another step would not make."""
        _, stage_step, stage_len = self._clock(steps)
        return stage_step + 1 >= stage_len

    def sync_clock(self, steps: int) -> None:
        """Set the host counters to what ``steps`` steps leave (after a CUDA-graph replay of a
        step that ended no stage, whose ``step()`` Python never ran)."""
        self.stage, self.stage_step, self.stage_len = self._clock(steps)
        self.stage_ended = steps > 0 and self.stage_step == 0

    def _new_stage_state(self, state: dict) -> None:
        """Per-parameter state a subclass resets at every stage start."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.stage_ended = False
        for group in self.param_groups:
            self._step_group(group)
        self._advance()
        return loss

    def _step_group(self, group: dict) -> None:
        """One step of one parameter group, eagerly, parameter by parameter."""
        for p in group["params"]:
            state = self.state[p]
            if "ref" not in state:
                state["ref"] = p.detach().clone()
                state["sum"] = torch.zeros_like(p)
                self._new_stage_state(state)
            if p.grad is not None:
                g = p.grad
                if group["weight_decay"] and not group["ascent"]:
                    g = g.add(p, alpha=group["weight_decay"])
                self._update(p, g, state, group)
            state["sum"].add_(p)

    def _advance(self) -> None:
        """Count the step; end the stage after its last one."""
        self.stage_step += 1
        if self.stage_step >= self.stage_len:
            self._end_stage()

    #: the descent update of a whole group as one function of tensor lists (see
    #: :meth:`compiled_step`); set by each subclass
    _fused_descent = None

    def compiled_step(self, compile_fn=None):
        """A ``step()`` (no closure) whose descent groups' arithmetic is ``torch.compile``'d.

        The per-parameter passes of :meth:`_update` plus the stage sum, written out once for all
        parameters of a group (:meth:`_fused_descent`) and compiled (``compile_fn``, default
        ``torch.compile``: inductor's fused C++ loops on a CPU) into a few loops that read and
        write each element once, where the eager step makes a chain of passes over every tensor:
        the step is bound by memory bandwidth, so this is most of the gain
        (``python -m scripts.cpu.bench_optimizers --compiled``). The group's numbers (lr,
        :math:`\\gamma`, AdaGrad's offset, the L2 weight) go in as 0-d tensors refilled at each
        step, so a new stage's lr compiles nothing new. Ascent groups (the dual variable), a
        group's first step (its state is made then), a parameter without a gradient and the stage
        end (averaging) stay eager, as does everything on the host (the stage clock).

        Returns the step function; it returns ``None``, or the error of a group's compiled call
        after which it stepped that group and every later one eagerly (so far and from then on:
        no group is stepped twice; :func:`lpmetrics.run.optimizer_step.build_step` records it).

        The compiled loops need not round as the eager passes do (a fused multiply-add, another
        order of operations): the two forms agree to rounding, not bit for bit; each is
        deterministic, so a run resumed on the form it began with repeats itself.
        """
        kernel = (compile_fn or torch.compile)(type(self)._fused_descent, dynamic=False)
        numbers: dict[int, list[torch.Tensor]] = {}
        failed: list[Exception] = []

        @torch.no_grad()
        def step() -> Exception | None:
            self.stage_ended = False
            for index, group in enumerate(self.param_groups):
                params = group["params"]
                if failed or group["ascent"] or not params or any(p.grad is None or "ref" not in self.state[p]
                                                                  for p in params):
                    self._step_group(group)
                    continue
                values = self._fused_numbers(group)
                held = numbers.get(index)
                if held is None or held[0].dtype != params[0].dtype or held[0].device != params[0].device:
                    held = numbers[index] = [torch.zeros((), dtype=params[0].dtype, device=params[0].device)
                                             for _ in values]
                for tensor, value in zip(held, values):
                    tensor.fill_(value)
                states = [self.state[p] for p in params]
                try:
                    kernel(params, [p.grad for p in params], [s["ref"] for s in states],
                           [s["sum"] for s in states], [s.get("sq_sum") for s in states],
                           *held, bool(group["weight_decay"]))
                except Exception as err:   # noqa: BLE001 -- a compile error: nothing was written yet;
                    failed.append(err)       # this group and the rest step eagerly, now and after
                    self._step_group(group)
            self._advance()
            return failed[0] if failed else None

        return step

    def _fused_numbers(self, group: dict) -> tuple[float, ...]:
        """(lr, gamma, offset, weight decay) of ``group`` for :meth:`_fused_descent`."""
        return group["lr"], group["gamma"], 0.0, group["weight_decay"]

    def _end_stage(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if self.average:
                    p.copy_(state["sum"] / self.stage_step)
                state["ref"].copy_(p)
                state["sum"].zero_()
                self._new_stage_state(state)
            group["lr"] /= 3.0
        self.stage += 1
        self.stage_step = 0
        self.stage_len *= 3
        self.stage_ended = True

    def state_dict(self) -> dict:
        out = super().state_dict()
        out["stages"] = {"stage": self.stage, "stage_step": self.stage_step,
                         "stage_len": self.stage_len}
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        stages = state_dict.pop("stages", None)
        super().load_state_dict(state_dict)
        if stages is not None:
            self.stage, self.stage_step = stages["stage"], stages["stage_step"]
            self.stage_len = stages["stage_len"]


class PPDSG(_StagewiseProximalPrimalDual):
    """PPD-SG (Algorithm 1): proximal primal-dual SGD in stages of ``T0 * 3**(k-1)`` steps.

    Args:
        params: parameter groups; a group with ``ascent=True`` is maximised (the dual variable).
        lr: :math:`\\eta_0`, the first stage's step size (divided by 3 per stage).
        gamma: :math:`\\gamma`; the proximal weight is :math:`1/\\gamma` (larger = weaker pull).
        T0: first stage length in steps; stage :math:`k` lasts :math:`T_0 3^{k-1}`.
        weight_decay: L2 added to the primal gradients (0 = the paper).
        average: output the stage average (the paper) instead of the last iterate.

    Example::

        >>> w = torch.nn.Parameter(torch.ones(2)); alpha = torch.nn.Parameter(torch.zeros(()))
        >>> opt = PPDSG([{"params": [w]}, {"params": [alpha], "ascent": True}], lr=0.1, T0=2)
        >>> (w.sum() - alpha ** 2 + alpha).backward(); opt.step(); opt.stage_ended
        False
    """

    def __init__(self, params, lr: float = 0.1, gamma: float = 500.0, T0: int = 2000,
                 weight_decay: float = 0.0, average: bool = True) -> None:
        super().__init__(params, lr, gamma, T0, weight_decay, average)

    def _update(self, p, g, state, group):
        if group["ascent"]:
            p.add_(g, alpha=group["lr"])
        else:   # p - lr (g + (p - ref) / gamma), as two in-place passes and no temporary
            p.lerp_(state["ref"], group["lr"] / group["gamma"]).add_(g, alpha=-group["lr"])

    @staticmethod
    def _fused_descent(ps, gs, refs, sums, sqs, lr, gamma, offset, decay, decays: bool):
        """:meth:`_update`'s descent and the stage sum on lists of tensors (for ``torch.compile``)."""
        for p, g, ref, total in zip(ps, gs, refs, sums):
            if decays:
                g = g + decay * p
            new = p - lr * (g + (p - ref) / gamma)
            p.copy_(new)
            total.add_(new)


class PPDAdaGrad(_StagewiseProximalPrimalDual):
    """PPD-AdaGrad (Algorithm 3): the same stages with a per-coordinate AdaGrad inner loop.

    Args: as :class:`PPDSG`, plus ``delta`` (:math:`\\delta`, AdaGrad's offset in
    :math:`H_t = \\delta + s_t`; 0.5 as Liu et al.'s official code: it bounds a stage's first
    steps by :math:`\\eta_k |g| / \\delta` instead of :math:`\\eta_k` on every coordinate).
    """

    def __init__(self, params, lr: float = 0.01, gamma: float = 500.0, T0: int = 2000,
                 weight_decay: float = 0.0, average: bool = True, delta: float = 0.5) -> None:
        super().__init__(params, lr, gamma, T0, weight_decay, average, delta=delta)

    def _new_stage_state(self, state: dict) -> None:
        if "sq_sum" in state:   # in place: a captured CUDA graph keeps reading this tensor
            state["sq_sum"].zero_()
        else:
            state["sq_sum"] = torch.zeros_like(state["ref"])

    def _update(self, p, g, state, group):
        state["sq_sum"].addcmul_(g, g)
        eta = group["lr"]
        if group["ascent"]:
            p.addcdiv_(g, state["sq_sum"].sqrt().add_(group["delta"]), value=eta)
        else:
            # (H p - eta g + (eta / gamma) ref) / (H + eta / gamma), H = delta + sqrt(sq_sum), written
            # as p - eta (g + (p - ref) / gamma) / (H + eta / gamma): two temporaries, not seven
            # (python -m scripts.cpu.bench_optimizers times the step beside torch's SGD)
            den = state["sq_sum"].sqrt().add_(group["delta"] + eta / group["gamma"])
            p.addcdiv_(torch.sub(p, state["ref"]).div_(group["gamma"]).add_(g), den, value=-eta)

    def _fused_numbers(self, group: dict) -> tuple[float, ...]:
        return group["lr"], group["gamma"], group["delta"] + group["lr"] / group["gamma"], group["weight_decay"]

    @staticmethod
    def _fused_descent(ps, gs, refs, sums, sqs, lr, gamma, offset, decay, decays: bool):
        """:meth:`_update`'s descent (``offset`` = delta + lr / gamma), its squared-gradient sums
        and the stage sum on lists of tensors (for ``torch.compile``)."""
        for p, g, ref, total, sq in zip(ps, gs, refs, sums, sqs):
            if decays:
                g = g + decay * p
            s = sq + g * g
            sq.copy_(s)
            new = p - lr * ((p - ref) / gamma + g) / (torch.sqrt(s) + offset)
            p.copy_(new)
            total.add_(new)
