r"""Each device window chooses its pack variant: :func:`select_mode` (gate, then time).

The packed forward has several implementations (:data:`packed.model.MODES`): ``vmap`` (cuDNN
grouped convolutions), ``gemm`` (torchvision ResNets only: batched GEMMs over the runs,
:mod:`packed.gemm`), ``loop`` (each run's own kernels) and ``streams`` (``loop`` with each run on
its own CUDA stream and its batch in the lone run's layout: the exact fallback, which passes the
gate only at distance 0, :data:`EXACT`). Which is fastest depends on the card,
the model, the image size and the pack size, and a mode is only worth its speed if it trains the
runs ``train.py`` would. So a window, before it trains, takes its first planned pack and

1. **gates** every candidate: a fresh copy of the pack (the runs' initial weights and objectives,
   the launcher's construction: :func:`packed.graph.capture_form`, :class:`packed.PackedStep`
   with the launcher's sync-free and pack-update defaults) takes :data:`STEPS` training steps in
   that mode on the runs' own first batches (:class:`data.stream.BatchStream`), and each run's
   parameters are compared with the same run stepped alone ``train.py``'s way (its model,
   objective, optimizer and schedule, the loop body of :func:`run.loop.train`). With
   :math:`\theta_i` run ``i``'s model parameters flattened,

   .. math::
      d_i = \frac{\lVert \theta_i^{\mathrm{pack}} - \theta_i^{\mathrm{lone}} \rVert_2}
                 {\lVert \theta_i^{\mathrm{lone}} \rVert_2}, \qquad
      \text{pass} \iff \max_i \frac{d_i}{\max(r_i, \varepsilon_{32})} \le K,

   where :math:`r_i` is the same distance between two lone runs of run ``i`` that differ only in
   a rounding choice the project already accepts (:func:`reference`): on CUDA in float32, TF32 on vs off
   (``torch.backends.cudnn.allow_tf32`` and ``torch.backends.cuda.matmul.allow_tf32`` both set,
   then both cleared); on the CPU, where there is no TF32, float32 vs float64 (the float32 run's
   own rounding error, nonzero on any network that sums); for runs configured
   ``trainer.precision=bf16``, bf16 vs float32 (the error that precision already brings).
   :math:`\varepsilon_{32} = 2^{-23}` (float32's machine epsilon) floors :math:`r` so that a
   reference that happens to be 0 still admits rounding; an exact mode (:math:`d_i = 0`: ``loop``
   on the CPU on flat data, below) always passes. :data:`K` = 4: a correct variant differs from the lone run by
   the rounding of other kernels, so its distance to the exact trajectory is of the reference's
   order and its distance to the lone run (itself that far from exact) at most about twice it
   (triangle inequality); another factor 2 covers kernels whose rounding three chaotic SGD steps
   amplify differently. A real error (a mixed run, wrong BatchNorm statistics, a missing term)
   moves parameters by the order of an update, 1e-3 to 1e-1 relative, far above 4 rounding
   errors of a well-conditioned run (1e-8 to 1e-5). Per run, not pooled: how much three steps
   amplify rounding differs by orders between runs. On the CPU, a pack of ``ce`` and ``auc_lp``
   at seeds 0 and 1 (``dataset=cifar10 model=resnet18 trainer.batch_size=8``, lr 0.1):
   :math:`r_i` = 0.063 and 0.13 for the ``ce`` runs (gradient norms near 100: three steps blow a
   1e-7 rounding up to 10 %), 3.5e-8 and 7.1e-6 for the ``auc_lp`` runs; logits scaled by 1.001
   in ``vmap`` moved the ``ce`` runs by 0.069 and 0.13 (hidden in their reference) but the
   second ``auc_lp`` run by 4.4e-4, 62 times its reference: failed. Pooled, the chaotic runs
   would hide the error; per run, the gate is as sharp as the pack's best-conditioned run.

   The image packs' batches are channels-last views; ``train.py`` feeds them so, the pack
   stacks them contiguous (:func:`packed.launch._draw`), so on image data even ``loop`` differs
   from the lone runs by rounding (ratios 1.1-1.2 in the pack above), and is exact on flat data;
   ``streams`` hands each run its rows back in channels-last and is exact on both.
2. **times** every passing candidate: its gated pack goes on stepping (what the launcher would
   step: :func:`packed.launch.step_runner`, so a CUDA graph's replay where asked), :data:`WARM`
   untimed steps, then up to :data:`REPS` timed ones, candidates interleaved round by round so
   drifting load hits all (:func:`packed.speed.interleaved_ms`, one step per candidate a round);
   the median pack step over the pack size is the rate.
3. **chooses** the fastest passing candidate. A window chooses once, on its first planned pack,
   and trains every pack in that mode (``train_packed(mode=)``; a pack that cannot take it runs
   ``auto``).
4. **times one evaluation** of the chosen candidate's pack, as the launcher evaluates it
   (:func:`evaluation_ms`): with the timed step, what the window's plan is priced again with, since
   a pack's step and evaluation in the chosen mode differ from the probe's line through packs of
   1 and 8 in another mode.

Budget: everything (building the runs, the lone references, the gates, the timing) counts
against ``budget_s``; timing stops when it runs out and the choice is made among what was timed.
Any error (building, the references), no passing candidate timed, or a budget spent before any
was: the default mode (``auto``: ``vmap`` on CUDA, ``loop`` on the CPU), with the reason. A
candidate that raises is recorded with its error and left out. Precision never changes: every
candidate runs at the runs' ``trainer.precision`` (on CUDA that makes the bf16 variants the
candidates exactly where runs are configured bf16).

The record (JSON-ready dict): ``chosen`` (the mode to train with), ``why``, ``fell_back`` (the
reason, or ``None``), ``default``, ``device``, ``precision``, ``runs`` (names), ``pack_size``,
``gate`` (``k``, ``steps``, ``reference`` in words, ``reference_distance`` :math:`r_i` per run,
``floor``), ``candidates`` (per mode: ``mode``, ``precision``, ``gate_distance`` :math:`d_i` per
run, ``reference_distance`` :math:`r_i` per run, ``gate_ratio`` :math:`\max_i d_i / \max(r_i,
\varepsilon_{32})`, ``passed``, ``ms_per_run_step`` and ``timed_steps``, ``why`` when it was not
available, failed, raised or was not timed), ``timing`` (``warm_steps``, ``timed_steps`` at most,
``interleaved``, ``cuda_graph``), ``evaluation`` (``ms`` of one evaluation of the chosen pack, or
``None`` and ``why``; absent where nothing was chosen by timing), ``budget_s``, ``elapsed_s``.
"""
from __future__ import annotations

import contextlib
import copy
import math
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

K = 4                 # gate: at most K reference distances (why: the module docstring)
FLOOR = 2.0 ** -23    # float32's machine epsilon: the least reference scale
STEPS = 3             # training steps of the gate
WARM = 2              # untimed steps per candidate (momentum buffers, kernel choice, gemm plan)
REPS = 5              # timed steps per candidate, at most
BUDGET_S = 60.0       # default wall seconds for the whole choice


@dataclass
class Lone:
    """One run alone at its initial state, as ``train.py`` holds it."""
    model: torch.nn.Module
    objective: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    max_grad_norm: float | None


@dataclass
class Trial:
    """What :func:`select_mode` steps: the pack's first batches (``batches``: ``[N, B, ...]``,
    ``[N, B]`` per step, as the launcher stacks them; ``alone``: per step each run's ``(x, y)`` as
    its stream gives it to ``train.py``), a fresh copy of the pack in a mode
    (``packed_step(mode)``) and of run ``i`` alone in a dtype (``lone(i, dtype)``), and one model
    of the pack (which modes it can take)."""
    names: list[str]
    device: torch.device
    precision: str
    amp: torch.dtype | None
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    alone: list[list[tuple[torch.Tensor, torch.Tensor]]]
    packed_step: Callable[[str], object]
    lone: Callable[[int, torch.dtype], Lone]
    model: torch.nn.Module
    rows: list | None = None   # the runs as prepared (cfg, bundle, eval_splits): the evaluation timed


#: modes that run each run's own kernels in its own layout: they pass the gate only at distance 0
EXACT = ("streams",)


def default_mode(device: torch.device) -> str:
    """What ``mode="auto"`` runs on ``device`` (:class:`packed.model.PackedModels`)."""
    return "vmap" if device.type == "cuda" else "loop"


def candidates(model: torch.nn.Module) -> list[tuple[str, str | None]]:
    """``(mode, why it is unavailable or None)`` for the modes a pack of ``model`` can take."""
    from lpmetrics.packed import gemm
    try:
        gemm.plan(model)
        why = None
    except gemm.GemmPlanError as err:
        why = f"not available: {err}"
    return [("vmap", None), ("gemm", why), ("loop", None), ("streams", None)]


@contextlib.contextmanager
def _tf32(on: bool):
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)   # tensors an objective makes inside (solver workspaces) follow
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _lone_params(trial: Trial, i: int, dtype=torch.float32, amp: torch.dtype | None = None) -> torch.Tensor:
    """Run ``i`` alone for the gate's steps, the loop body of :func:`run.loop.train`; its model
    parameters flattened (float64)."""
    with _default_dtype(dtype):
        run = trial.lone(i, dtype)
        for step, batches in enumerate(trial.alone):
            x, y = batches[i]
            x = x.to(dtype) if x.is_floating_point() else x
            if amp is None:
                logits = run.model(x)
            else:
                with torch.autocast(x.device.type, dtype=amp):
                    logits = run.model(x)
                logits = logits.float()
            loss = run.objective(logits, y)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{trial.names[i]} alone: loss is {loss.item()} at step {step + 1}")
            run.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if run.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.max_grad_norm)
            run.optimizer.step()
            run.scheduler.step()
            run.objective.on_step_end(step=step, model=run.model, optimizer=run.optimizer, batch=(x, y))
    return torch.cat([p.detach().double().flatten() for p in run.model.parameters()])


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def reference(trial: Trial) -> tuple[list[torch.Tensor], list[float], str]:
    """(each run's lone parameters, as configured: the gate's target; each run's reference
    distance :math:`r_i`; what :math:`r_i` compares)."""
    n = len(trial.names)
    target = [_lone_params(trial, i, amp=trial.amp) for i in range(n)]
    if trial.amp is not None:
        other = [_lone_params(trial, i) for i in range(n)]
        return target, list(map(_distance, target, other)), "lone run in bf16 (as configured) vs in float32"
    if trial.device.type == "cuda":
        with _tf32(True):
            on = [_lone_params(trial, i) for i in range(n)]
        with _tf32(False):
            off = [_lone_params(trial, i) for i in range(n)]
        return target, list(map(_distance, on, off)), "lone run with TF32 on vs off (CUDA, float32)"
    exact = [_lone_params(trial, i, torch.float64) for i in range(n)]
    return target, list(map(_distance, target, exact)), "lone run in float32 vs float64 (CPU: no TF32)"


def _sync_free_ctx(stepper):
    from lpmetrics.objectives.common import labels_checked
    return labels_checked() if stepper.sync_free else contextlib.nullcontext()


def gate_distances(trial: Trial, stepper, target: list[torch.Tensor]) -> list[float]:
    """Step ``stepper`` (a fresh pack) on the trial's batches; each run's :math:`d_i` against
    ``target`` (infinite for a run the pack froze: its lone twin stayed finite)."""
    for step, (x, y) in enumerate(trial.batches):
        with _sync_free_ctx(stepper):
            stepper.step(x, y, step)
    stepper.poll()
    params = stepper.packed.params
    return [math.inf if i in stepper.divergences else
            _distance(torch.cat([v[i].detach().double().flatten() for v in params.values()]), t)
            for i, t in enumerate(target)]


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"


def _time_rounds(runners: dict, trial: Trial, rows: dict, deadline: float) -> None:
    """Interleaved timing (module docstring, 2.) into ``rows[mode]``; a runner that raises is
    dropped with its error."""
    from lpmetrics.packed.speed import interleaved_ms
    x, y = trial.batches[0]
    steps = {k: iter(range(STEPS, 1 << 62)) for k in runners}
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(REPS):
        if time.monotonic() >= deadline:   # whole rounds: every candidate timed as often
            break
        for mode in list(runners):
            runner = runners[mode]

            def one(runner=runner, mode=mode):
                with _sync_free_ctx(runner.stepper if hasattr(runner, "stepper") else runner):
                    runner.step(x, y, next(steps[mode]))
            warm = WARM + getattr(runner, "warmup", 0) if r == 0 else 0
            try:
                samples[mode].append(interleaved_ms({mode: one}, 1, trial.device, warmup=warm)[mode])
            except Exception as err:   # noqa: BLE001 -- this candidate is out, the others go on
                rows[mode]["why"] = f"raised while timed: {_first_line(err)}"
                del runners[mode]
    n = len(trial.names)
    for mode, times in samples.items():
        if times and mode in runners:
            rows[mode].update(ms_per_run_step=round(statistics.median(times) / n, 4), timed_steps=len(times))
        elif mode in runners:
            rows[mode]["why"] = "not timed: the budget ran out"


def _gate(trial: Trial, mode: str, target: list[torch.Tensor], ref: list[float], row: dict):
    """Gate ``mode`` into ``row``; its stepped pack if it passed, else ``None``."""
    try:
        stepper = trial.packed_step(mode)
        d = gate_distances(trial, stepper, target)
    except Exception as err:   # noqa: BLE001 -- recorded, the other candidates go on
        row["why"] = f"raised: {_first_line(err)}"
        return None
    ratios = [di / max(ri, FLOOR) if di == di else math.inf for di, ri in zip(d, ref)]   # NaN fails
    worst = max(range(len(d)), key=ratios.__getitem__)
    exact = mode in EXACT
    row.update(gate_distance=d, gate_ratio=ratios[worst],
               passed=ratios[worst] <= K and (not exact or max(d) == 0.0))
    if row["passed"]:
        return stepper
    if exact and ratios[worst] <= K:
        row["why"] = (f"failed the gate: {trial.names[worst]} is {d[worst]:.3g} from its lone run; "
                      f"mode {mode!r} must equal it bit for bit")
        return None
    row["why"] = (f"failed the gate: {trial.names[worst]} is {d[worst]:.3g} from its lone run, "
                  f"{ratios[worst]:.3g} x its reference {ref[worst]:.3g} (at most {K} x)")
    return None


def choose(trial: Trial, budget_s: float = BUDGET_S, cuda_graph: bool = False,
           modes: list[str] | None = None, start: float | None = None) -> dict:
    """Gate, time and choose among ``modes`` (default: :func:`candidates`) for ``trial``."""
    from lpmetrics.packed.launch import step_runner
    start = time.monotonic() if start is None else start
    deadline = start + budget_s
    n, default = len(trial.names), default_mode(trial.device)
    record = {"default": default, "device": str(trial.device), "precision": trial.precision,
              "runs": list(trial.names), "pack_size": n, "budget_s": budget_s}
    target, ref, what = reference(trial)
    record["gate"] = {"k": K, "steps": STEPS, "reference": what, "reference_distance": ref, "floor": FLOOR}
    record["timing"] = {"warm_steps": WARM, "timed_steps": REPS, "interleaved": True, "cuda_graph": cuda_graph}
    rows, runners = {}, {}
    for mode, why in candidates(trial.model):
        if modes is not None and mode not in modes:
            continue
        rows[mode] = {"mode": mode, "precision": trial.precision, "gate_distance": None,
                      "reference_distance": ref, "gate_ratio": None, "passed": False, "ms_per_run_step": None}
        if why or time.monotonic() >= deadline:
            rows[mode]["why"] = why or "not gated: the budget ran out"
            continue
        stepper = _gate(trial, mode, target, ref, rows[mode])
        if stepper is not None:
            runners[mode] = step_runner(stepper, cuda_graph, trial.device, n)
    _time_rounds(runners, trial, rows, deadline)
    record["candidates"] = list(rows.values())
    timed = [r for r in rows.values() if r["ms_per_run_step"] is not None]
    if not timed:
        record.update(chosen=default, fell_back="no passing candidate was timed (see each one's why)",
                      why=f"the default ({default})")
    else:
        best = min(timed, key=lambda r: r["ms_per_run_step"])
        rates = ", ".join(f"{r['mode']} {r['ms_per_run_step']:.3g}" for r in timed)
        record.update(chosen=best["mode"], fell_back=None,
                      why=f"fastest passing candidate (ms per run-step: {rates})")
        record["evaluation"] = evaluation_ms(trial, runners[best["mode"]], deadline)
    record["elapsed_s"] = round(time.monotonic() - start, 2)
    return record


def evaluation_ms(trial: Trial, runner, deadline: float) -> dict:
    """``{"ms", "why"}``: one evaluation of the chosen candidate's pack, as the launcher evaluates
    at a step where every run is due (:func:`packed.speed.pack_eval_ms`), so the plan can price
    this pack's evaluations as measured (``scripts.campaign.cli.reprice_plan``); ``ms`` is
    ``None`` (with ``why``) without rows, past the budget, or where it raised (it never changes
    the choice)."""
    from lpmetrics.packed.speed import pack_eval_ms
    if trial.rows is None:
        return {"ms": None, "why": "no runs to evaluate"}
    if time.monotonic() >= deadline:
        return {"ms": None, "why": "not timed: the budget ran out"}
    stepper = getattr(runner, "stepper", runner)   # a graphed step holds the pack's stepper
    try:
        return {"ms": round(pack_eval_ms(stepper.packed, trial.rows, trial.device), 1), "why": None}
    except Exception as err:   # noqa: BLE001 -- e.g. out of memory: recorded, the choice stands
        return {"ms": None, "why": f"raised: {_first_line(err)}"}


def trial_from_jobs(jobs: list, work: Path, max_pack: int | None = None, steps: int = STEPS) -> Trial:
    """The first pack the launcher would form of ``jobs`` (:class:`packed.launch.Job`), each run
    prepared as :func:`run.prepare.prepare_run` prepares it (run folders under ``work``)."""
    from lpmetrics.run.builders import autocast_dtype, resolve_device
    from lpmetrics.run.prepare import prepare_run
    from lpmetrics.run.validate import validate
    from lpmetrics.data.stream import BatchStream
    from lpmetrics.packed.launch import group, pack_key
    runs = []
    for k, job in enumerate(jobs):
        if job.cfg.resume:
            raise ValueError(f"{job.name}: resume={job.cfg.resume}; the selector takes fresh runs only")
        validate(job.cfg)
        runs.append(prepare_run(job.cfg, work / (job.name or str(k)), resolve_device(job.cfg.device))[0])
    first = group([pack_key(r.cfg, r) for r in runs], max_pack)[0][0]
    runs, names = [runs[i] for i in first], [jobs[i].name or str(i) for i in first]
    device = runs[0].device
    streams = []
    for r in runs:
        r.bundle.to(device)
        streams.append(BatchStream(r.bundle.train, r.cfg.trainer.batch_size, r.cfg.seed))
    alone = [[next(s) for s in streams] for _ in range(steps)]
    batches = [(torch.stack(xs).to(device).contiguous(), torch.stack(ys).to(device))   # packed.launch._draw
               for xs, ys in (zip(*drawn) for drawn in alone)]
    return Trial(names, device, str(runs[0].cfg.trainer.precision), autocast_dtype(runs[0].cfg),
                 batches, alone, lambda mode: _fresh_pack(runs, mode),
                 lambda i, dtype: _fresh_lone(runs[i], dtype), runs[0].model, runs)


def _attached(run, model, objective) -> tuple:
    """The optimizer and schedule :meth:`run.job.Run.attach_optimizer` builds over ``model``, on a
    shallow twin of ``run`` (the run itself keeps its initial model)."""
    twin = copy.copy(run)
    twin.objective = objective
    twin.attach_optimizer(model)
    return twin.optimizer, twin.scheduler


def _fresh_pack(runs: list, mode: str):
    """The pack as :func:`packed.launch.train_packed` builds it, from the runs' initial state."""
    from lpmetrics.run.builders import autocast_dtype
    from lpmetrics.packed.graph import capture_form
    from lpmetrics.packed.model import pack
    from lpmetrics.packed.step import PackedStep
    device = runs[0].device
    objectives = [capture_form(copy.deepcopy(r.objective), device) for r in runs]
    packed = pack([copy.deepcopy(r.model) for r in runs], mode)
    packed.train()
    opts, scheds = zip(*(_attached(r, v, o) for r, v, o in zip(runs, packed.models, objectives)))
    return PackedStep(packed, objectives, list(opts), list(scheds), [r.cfg.trainer.max_grad_norm for r in runs],
                      sync_free=device.type == "cuda", autocast=autocast_dtype(runs[0].cfg))


def _fresh_lone(run, dtype: torch.dtype) -> Lone:
    model = copy.deepcopy(run.model).to(dtype).train()
    objective = copy.deepcopy(run.objective).to(dtype)
    return Lone(model, objective, *_attached(run, model, objective), run.cfg.trainer.max_grad_norm)


def select_mode(jobs: list, budget_s: float = BUDGET_S, max_pack: int | None = None,
                cuda_graph: bool = False, modes: list[str] | None = None) -> dict:
    """The record of :func:`choose` for the first pack of ``jobs``; on any error, the default
    mode with the reason (``fell_back``), so a window never loses its training to the choice."""
    start = time.monotonic()
    device = None
    try:
        with tempfile.TemporaryDirectory(prefix="pack_select_") as work:
            trial = trial_from_jobs(jobs, Path(work), max_pack)
            device = trial.device
            try:
                return choose(trial, budget_s, cuda_graph, modes, start)
            finally:
                del trial
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    except Exception as err:   # noqa: BLE001 -- the window trains with the default instead
        traceback.clear_frames(err.__traceback__)
        if device is None:
            from lpmetrics.run.builders import resolve_device
            with contextlib.suppress(Exception):
                device = resolve_device(jobs[0].cfg.device)
        default = default_mode(device or torch.device("cpu"))
        return {"chosen": default, "default": default, "fell_back": f"the selector raised: {_first_line(err)}",
                "why": f"the default ({default})", "device": str(device), "candidates": [],
                "budget_s": budget_s, "elapsed_s": round(time.monotonic() - start, 2)}
