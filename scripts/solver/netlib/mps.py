r"""Read an LP from an MPS file (free or fixed format) and convert it to our standard form.

Tooling of the benchmark on public LPs (``python -m scripts.solver.bench_solver --family public``)
and of the solver tests, kept outside the LP layer: the netlib LPs it reads lie beside it.

MPS (IBM's Mathematical Programming System format; the netlib LP collection is written in it)
describes

.. math::  \min c^\top x + c_0 \quad\text{s.t.}\quad r^{lo} \le Ax \le r^{hi},\;
           l \le x \le u

by sections ``NAME``, ``ROWS`` (``N`` objective, ``L`` ``<=``, ``G`` ``>=``, ``E`` ``=``),
``COLUMNS``, ``RHS``, ``RANGES``, ``BOUNDS`` (``UP LO FX FR MI PL BV LI UI``) and ``ENDATA``;
``OBJSENSE MAX`` flips the objective.  Defaults: ``x >= 0``, an ``UP`` bound below 0 on a
variable without a lower bound makes it ``<= u`` with ``l = -inf`` (the common reading, as in
HiGHS and CPLEX).  The RHS of the objective row is ``-c_0``.  Integer markers are read and
ignored (the LP relaxation).

Free format splits fields on whitespace (names without spaces); fixed format reads the
columns 2-3, 5-12, 15-22, 25-36, 40-47, 50-61, so names may hold spaces.  ``fmt="auto"``
(default) reads free format, which also reads every fixed-format file whose names have no
spaces (all of netlib).

:func:`to_standard_form` rewrites the model as ``min c^T z s.t. A z <= b, A_eq z = b_eq,
z >= 0`` (the form of :func:`solver.solve_lp`) with ``x = x_0 + T z``:
``l`` finite: ``x = l + z`` (plus the row ``z <= u - l`` where ``u`` is finite);
``l = -inf < u``: ``x = u - z``; free: ``x = z^+ - z^-``; fixed: ``x = l``, no variable.
A ``G`` row is negated, a ranged or two-sided row becomes two inequalities.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lpmetrics.solver import LPInputError, MPSFormatError

SECTIONS = ("NAME", "ROWS", "COLUMNS", "RHS", "RANGES", "BOUNDS", "ENDATA", "OBJSENSE",
            "OBJSENSE MAX", "OBJSENSE MIN", "OBJSENSE MAXIMIZE", "OBJSENSE MINIMIZE")
# fixed-format field columns (0-based slices): type, name1, name2, value1, name3, value2
_FIXED = ((1, 3), (4, 12), (14, 22), (24, 36), (39, 47), (49, 61))


@dataclass
class MPSModel:
    """``min c^T x + offset s.t. row_lo <= A x <= row_hi, lo <= x <= hi`` as read."""
    name: str
    c: np.ndarray                # [n]
    A: sp.csr_matrix             # [m, n]
    row_lo: np.ndarray           # [m] (-inf: none)
    row_hi: np.ndarray           # [m] (+inf: none)
    lo: np.ndarray               # [n]
    hi: np.ndarray               # [n]
    offset: float = 0.0
    row_names: list = field(default_factory=list)
    col_names: list = field(default_factory=list)
    integer: np.ndarray | None = None   # [n] bool: columns marked integer (ignored)

    @property
    def shape(self):
        return self.A.shape


@dataclass
class StandardForm:
    """``min c^T z + offset s.t. A z <= b, A_eq z = b_eq, z >= 0`` with ``x = x0 + T z``."""
    c: np.ndarray
    A: sp.csr_matrix
    b: np.ndarray
    A_eq: sp.csr_matrix
    b_eq: np.ndarray
    offset: float
    x0: np.ndarray
    T: sp.csr_matrix

    def x(self, z):
        """The model's variables from a standard-form solution ``z``."""
        return self.x0 + self.T @ np.asarray(z, dtype=np.float64)


class _Reader:
    def __init__(self, path, fmt):
        self.path, self.fmt = str(path), fmt
        self.lineno, self.line = 0, ""

    def fail(self, why):
        raise MPSFormatError(f"{self.path}, line {self.lineno}: {why} (line: "
                             f"{self.line.rstrip()[:80]!r}). Check the file against the MPS "
                             f"format (free or fixed; fmt='fixed' for names with spaces).",
                             path=self.path, line=self.lineno)

    def fields(self, line):
        if self.fmt == "fixed":
            out = [line[a:b].strip() for a, b in _FIXED]
            while out and not out[-1]:
                out.pop()
            return out if out and out[0] else out[1:] if out else out
        return line.split()

    def number(self, text):
        try:
            v = float(text)
        except ValueError:
            self.fail(f"{text!r} is not a number")
        if math.isnan(v):
            self.fail("NaN coefficient")
        return v


def read_mps(path, fmt: str = "auto") -> MPSModel:
    """Parse the MPS file ``path`` (``fmt``: ``"auto"``/``"free"`` or ``"fixed"``).

    Raises:
        MPSFormatError (an :class:`solver.LPInputError`): a line that does not parse, naming
            the file, the line number and the line.
    """
    if fmt not in ("auto", "free", "fixed"):
        raise LPInputError(f"fmt={fmt!r}; choose 'auto', 'free' or 'fixed'.")
    r = _Reader(path, fmt)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise LPInputError(f"cannot read MPS file {path}: {err}.") from None
    name, section, objrow, maximize = "", None, None, False
    rows, row_type = {}, []           # name -> index (constraints only), 'L' | 'G' | 'E'
    cols, entries, cost = {}, [], {}
    rhs, ranges, bounds = {}, {}, []
    offset, integer_mode, integers = 0.0, False, set()
    free_rows = set()
    for r.lineno, r.line in enumerate(text.splitlines(), 1):
        line = r.line
        if not line.strip() or line.lstrip().startswith("*"):
            continue
        if not line[0].isspace():            # a section header
            head = line.split()
            section = head[0].upper()
            if section not in ("NAME", "ROWS", "COLUMNS", "RHS", "RANGES", "BOUNDS", "ENDATA",
                               "OBJSENSE", "OBJSENS"):
                r.fail(f"unknown section {head[0]!r}")
            if section == "NAME":
                name = head[1] if len(head) > 1 else ""
            if section in ("OBJSENSE", "OBJSENS") and len(head) > 1:
                maximize = head[1].upper().startswith("MAX")
            if section == "ENDATA":
                break
            continue
        f = r.fields(line)
        if section in ("OBJSENSE", "OBJSENS"):
            maximize = f[0].upper().startswith("MAX")
        elif section == "ROWS":
            if len(f) != 2 or f[0].upper() not in ("N", "L", "G", "E"):
                r.fail("a ROWS line is '<type N/L/G/E> <name>'")
            kind, rname = f[0].upper(), f[1]
            if rname in rows or rname == objrow or rname in free_rows:
                r.fail(f"row {rname!r} defined twice")
            if kind == "N":
                if objrow is None:
                    objrow = rname
                else:
                    free_rows.add(rname)     # further N rows are free rows: dropped
            else:
                rows[rname] = len(row_type)
                row_type.append(kind)
        elif section == "COLUMNS":
            if len(f) >= 3 and f[1].upper() == "'MARKER'":
                tag = f[2].upper()
                if tag not in ("'INTORG'", "'INTEND'"):
                    r.fail("a MARKER line needs 'INTORG' or 'INTEND'")
                integer_mode = tag == "'INTORG'"
                continue
            if len(f) not in (3, 5):
                r.fail("a COLUMNS line is '<column> <row> <value> [<row> <value>]'")
            j = cols.setdefault(f[0], len(cols))
            if integer_mode:
                integers.add(j)
            for rname, val in zip(f[1::2], f[2::2]):
                v = r.number(val)
                if rname == objrow:
                    cost[j] = cost.get(j, 0.0) + v
                elif rname in rows:
                    entries.append((rows[rname], j, v))
                elif rname not in free_rows:
                    r.fail(f"row {rname!r} is not declared in ROWS")
        elif section in ("RHS", "RANGES"):
            if len(f) % 2 == 1:
                f = f[1:]                    # the optional set name
            if len(f) not in (2, 4):
                r.fail(f"a {section} line is '[<set>] <row> <value> [<row> <value>]'")
            for rname, val in zip(f[0::2], f[1::2]):
                v = r.number(val)
                if section == "RHS" and rname == objrow:
                    offset = -v
                elif rname in rows:
                    (rhs if section == "RHS" else ranges)[rows[rname]] = v
                elif rname not in free_rows:
                    r.fail(f"row {rname!r} is not declared in ROWS")
        elif section == "BOUNDS":
            kind = f[0].upper() if f else ""
            if kind not in ("UP", "LO", "FX", "FR", "MI", "PL", "BV", "LI", "UI", "SC"):
                r.fail(f"unknown bound type {f[0] if f else ''!r}")
            needs_value = kind in ("UP", "LO", "FX", "LI", "UI", "SC")
            # '<type> [<set>] <column> [<value>]'
            want = 3 if needs_value else 2
            if len(f) == want + 1:
                f = [f[0]] + f[2:]
            if len(f) != want and not (kind == "BV" and len(f) == 3):
                r.fail(f"a BOUNDS line is '{kind} [<set>] <column>"
                       f"{' <value>' if needs_value else ''}'")
            if f[1] not in cols:
                r.fail(f"column {f[1]!r} is not declared in COLUMNS")
            bounds.append((kind, cols[f[1]], r.number(f[2]) if len(f) > 2 else None))
        elif section is None:
            r.fail("data before the first section")
    else:
        r.lineno, r.line = r.lineno + 1, ""
        r.fail("no ENDATA line (truncated file?)")
    if objrow is None and not cols:
        r.fail("no objective row and no columns")
    return _assemble(name, rows, row_type, cols, entries, cost, rhs, ranges, bounds, offset,
                     maximize, integers)


def _assemble(name, rows, row_type, cols, entries, cost, rhs, ranges, bounds, offset,
              maximize, integers):
    m, n = len(row_type), len(cols)
    c = np.zeros(n)
    for j, v in cost.items():
        c[j] = v
    if entries:
        i, j, v = (np.array(t) for t in zip(*entries))
    else:
        i = j = np.zeros(0, dtype=int)
        v = np.zeros(0)
    A = sp.csr_matrix((v, (i, j)), shape=(m, n))     # duplicates are summed
    b = np.zeros(m)
    for k, val in rhs.items():
        b[k] = val
    lo_r, hi_r = np.full(m, -np.inf), np.full(m, np.inf)
    for k, kind in enumerate(row_type):
        R = ranges.get(k)
        if kind == "L":
            hi_r[k] = b[k]
            lo_r[k] = -np.inf if R is None else b[k] - abs(R)
        elif kind == "G":
            lo_r[k] = b[k]
            hi_r[k] = np.inf if R is None else b[k] + abs(R)
        else:   # E: a range R widens it to [b, b + R] (R > 0) or [b + R, b] (R < 0)
            lo_r[k] = b[k] if R is None or R >= 0 else b[k] + R
            hi_r[k] = b[k] if R is None or R <= 0 else b[k] + R
    lo, hi = np.zeros(n), np.full(n, np.inf)
    for kind, j, val in bounds:
        if kind == "UP":
            hi[j] = val
            if val < 0 and lo[j] == 0:
                lo[j] = -np.inf
        elif kind in ("LO", "LI"):
            lo[j] = val
        elif kind == "UI":
            hi[j] = val
        elif kind == "FX":
            lo[j] = hi[j] = val
        elif kind == "FR":
            lo[j], hi[j] = -np.inf, np.inf
        elif kind == "MI":
            lo[j] = -np.inf
        elif kind == "PL":
            hi[j] = np.inf
        elif kind == "BV":
            lo[j], hi[j] = 0.0, 1.0
        elif kind == "SC":
            hi[j] = val if val is not None else np.inf
    if maximize:        # max c^T x = -min (-c)^T x: the model is the minimisation
        c, offset = -c, -offset
    integer = np.zeros(n, dtype=bool)
    integer[list(integers)] = True
    return MPSModel(name, c, A, lo_r, hi_r, lo, hi, offset,
                    [k for k, _ in sorted(rows.items(), key=lambda t: t[1])],
                    [k for k, _ in sorted(cols.items(), key=lambda t: t[1])], integer)


def to_standard_form(model: MPSModel) -> StandardForm:
    """``min c^T z + offset s.t. A z <= b, A_eq z = b_eq, z >= 0`` equivalent to ``model``
    (see the module docstring); an empty range ``lo > hi`` stays in as contradictory rows so
    the solver reports the LP infeasible."""
    n = model.A.shape[1]
    lo, hi = model.lo, model.hi
    x0 = np.zeros(n)
    t_rows, t_cols, t_vals = [], [], []
    box_cols, box_vals = [], []        # z_k <= u - l rows
    k = 0
    for j in range(n):
        if np.isfinite(lo[j]) and lo[j] == hi[j]:
            x0[j] = lo[j]                    # fixed: no variable
        elif np.isfinite(lo[j]):
            x0[j] = lo[j]
            t_rows.append(j), t_cols.append(k), t_vals.append(1.0)
            if np.isfinite(hi[j]):
                box_cols.append(k), box_vals.append(hi[j] - lo[j])
            k += 1
        elif np.isfinite(hi[j]):
            x0[j] = hi[j]
            t_rows.append(j), t_cols.append(k), t_vals.append(-1.0)
            k += 1
        else:
            t_rows += [j, j]
            t_cols += [k, k + 1]
            t_vals += [1.0, -1.0]
            k += 2
    T = sp.csr_matrix((t_vals, (t_rows, t_cols)), shape=(n, k))
    AT = (model.A @ T).tocsr()
    shift = model.A @ x0
    c = T.T @ model.c
    offset = model.offset + float(model.c @ x0)
    lo_r, hi_r = model.row_lo - shift, model.row_hi - shift
    eq = np.isfinite(lo_r) & (lo_r == hi_r)
    up = np.isfinite(hi_r) & ~eq
    dn = np.isfinite(lo_r) & ~eq
    box = sp.csr_matrix((np.ones(len(box_cols)), (np.arange(len(box_cols)), box_cols)),
                        shape=(len(box_cols), k))
    A_ub = sp.vstack([AT[up], -AT[dn], box], format="csr")
    b_ub = np.concatenate([hi_r[up], -lo_r[dn], np.asarray(box_vals, dtype=np.float64)])
    return StandardForm(np.asarray(c, dtype=np.float64), A_ub, b_ub, AT[eq].tocsr(), lo_r[eq],
                        offset, x0, T)
