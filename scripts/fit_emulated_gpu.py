"""Fit the realistic emulated GPU to recordings of a real one (``polls.csv`` / ``segments.csv``).

Prints every figure the realistic emulated GPU (:mod:`perseus.gpu.emulated.readings`) takes from the
H100 recordings in ``tests/data/h100-nvml`` and how well each fits; ``--write`` regenerates the
read-latency table ``perseus/data/h100_nvml/read_latency.csv``. Sections:

1. **Counter updates**: a strictly periodic grid explains every update the polls saw if a read
   returns the counter as of ``t0 + f * (t1 - t0)`` for ``f`` in a range; the margin by which the
   grid fits is printed per ``f`` (positive: every update inside its bracketing reads).
2. **Read latency** by phase of the read's start within the update period (the table).
3. **Counter lag**: the two-power model of probe1 (busy / idle) against every update interval.
4. **Idle power**, 5. **the instant power field** (update intervals, skipped updates, the window
   it averages), 6. **the power limiter** (back-to-back forwards at the 700 W cap), 7. **steady
   against in-pattern power** in probe3/4's 1F1B stage-0 windows.

Usage: ``python scripts/fit_emulated_gpu.py [--data DIR] [--write]`` (needs numpy).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROBES = ("probe1", "probe2", "probe3", "probe4")
PERIOD_S = 0.1
DT = 1e-4  # resolution of the power models (s)
BUSY = ("busy", "forward", "backward", "steady-forward", "steady-backward", "steady-forward-nograd")


def load(data: Path, probe: str) -> Tuple[Dict[str, np.ndarray], List[dict]]:
    raw = np.genfromtxt(data / probe / "polls.csv", delimiter=",", names=True)
    polls = {k: np.asarray(raw[k], dtype=float) for k in raw.dtype.names or ()}
    with open(data / probe / "segments.csv", newline="") as f:
        segs = list(csv.DictReader(f))
    for s in segs:
        s["a"], s["b"] = float(s["start_s"]), float(s["end_s"])
    return polls, segs


def grid(polls: Dict[str, np.ndarray], f: float) -> Tuple[float, float, float]:
    """``(period, offset, margin)``: the periodic grid that fits the updates best."""
    read = polls["t0_s"] + f * (polls["t1_s"] - polls["t0_s"])
    idx = np.nonzero(np.diff(polls["energy_mj"]) != 0)[0] + 1
    lo, hi = read[idx - 1], read[idx]
    k = np.round((lo - lo[0]) / PERIOD_S)
    best = (-1.0, PERIOD_S, 0.0)
    for period in np.linspace(PERIOD_S - 1e-5, PERIOD_S + 1e-5, 401):
        a, b = np.max(lo - k * period), np.min(hi - k * period)
        best = max(best, (b - a, period, 0.5 * (a + b)))
    margin, period, offset = best
    return period, offset, margin


class Trace:
    """A recording on a DT grid: what ran when, and the counter's updates on the fitted grid."""

    def __init__(self, data: Path, probe: str, f: float) -> None:
        self.polls, self.segs = load(data, probe)
        self.period, self.offset, _ = grid(self.polls, f)
        read = self.polls["t0_s"] + f * (self.polls["t1_s"] - self.polls["t0_s"])
        e = self.polls["energy_mj"]
        idx = np.nonzero(np.diff(e) != 0)[0] + 1
        k = np.floor((read[idx] - self.offset) / self.period)
        self.tk, self.ek = self.offset + k * self.period, e[idx] / 1000.0
        self.t0 = min(s["a"] for s in self.segs) - 2.5
        self.t = np.arange(self.t0, max(s["b"] for s in self.segs) + 2.5, DT)
        self.kind = np.full(len(self.t), "gap", dtype="U24")
        for s in self.segs:
            self.kind[self._i(s["a"]) : self._i(s["b"])] = s["kind"]

    def _i(self, t: float) -> int:
        return int((t - self.t0) / DT)

    def model_increments(self, power: np.ndarray, lag_s: float) -> np.ndarray:
        cum = np.concatenate([[0.0], np.cumsum(power) * DT])
        return np.diff(cum[((self.tk - lag_s - self.t0) / DT).astype(int)])

    def window_w(self, a: float, b: float, lag_s: float) -> Tuple[int, int, float]:
        """Counter updates bracketing ``[a, b]`` (lag-shifted) and the power between them."""
        m = np.nonzero((self.tk - lag_s >= a) & (self.tk - lag_s <= b))[0]
        i, j = m[0], m[-1]
        return i, j, (self.ek[j] - self.ek[i]) / (self.tk[j] - self.tk[i])

    def predicted_w(self, power: np.ndarray, i: int, j: int, lag_s: float) -> float:
        cum = np.concatenate([[0.0], np.cumsum(power) * DT])
        at = lambda t: cum[self._i(t - lag_s)]  # noqa: E731
        return (at(self.tk[j]) - at(self.tk[i])) / (self.tk[j] - self.tk[i])


def steady_w(tr: Trace, label: str, lag_s: float) -> float:
    seg = next(s for s in tr.segs if s["label"] == label)
    return tr.window_w(seg["a"] + 0.002, seg["b"] - 0.002, lag_s)[2]


def section_counter(data: Path) -> float:
    print("== 1. counter updates: strict-grid margin (ms) by read instant f")
    best = (-1.0, 0.0)
    for f in np.arange(0.0, 0.81, 0.1):
        margins = [grid(load(data, p)[0], f)[2] * 1000 for p in PROBES]
        print(f"f={f:.1f} " + " ".join(f"{m:7.3f}" for m in margins))
        best = max(best, (min(margins), round(float(f), 1)))
    f = best[1]
    for p in PROBES:
        period, _, margin = grid(load(data, p)[0], f)
        print(
            f"{p}: period {period * 1000:.4f} ms, grid fits every update by {margin * 1000:.2f} ms"
        )
    print(f"chosen f={f} (READ_AT_FRACTION)")
    return f


def section_latency(data: Path, f: float, write: bool) -> None:
    print("== 2. read latency by phase of the read's start (ms)")
    phase, lat = [], []
    for p in PROBES:
        polls, _ = load(data, p)
        period, offset, _ = grid(polls, f)
        phase.append(((polls["t0_s"] - offset) / period) % 1.0)
        lat.append(polls["t1_s"] - polls["t0_s"])
    ph, la = np.concatenate(phase), np.concatenate(lat)
    qs = np.arange(0, 101, 5)
    print("all reads:", np.round(np.percentile(la * 1000, [0, 5, 50, 95, 99, 100]), 2), len(la))
    rows = []
    for b in range(100):
        lo, w = b / 100.0, 0
        while True:  # widen sparse bins symmetrically until they hold 20 reads
            sel = ((ph - (lo - w / 100.0)) % 1.0) < (2 * w + 1) / 100.0
            if sel.sum() >= 20:
                break
            w += 1
        rows.append([lo, lo + 0.01, *np.percentile(la[sel], qs)])
        if b % 10 == 0:
            print(f"phase {lo:.2f}: n={sel.sum():4d} median {np.median(la[sel]) * 1000:.2f}")
    if write:
        out = ROOT / "perseus" / "data" / "h100_nvml" / "read_latency.csv"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="") as fh:
            table = csv.writer(fh)
            table.writerow(["phase_lo", "phase_hi"] + [f"q{q:03d}_s" for q in qs])
            for r in rows:
                table.writerow([f"{r[0]:.2f}", f"{r[1]:.2f}"] + [f"{v:.6f}" for v in r[2:]])
        print("wrote", out.relative_to(ROOT))


def section_lag(data: Path, f: float) -> float:
    print("== 3. counter lag: probe1 two-power model, RMS of every update's increment (J)")
    tr = Trace(data, "probe1", f)
    busy = np.isin(tr.kind, BUSY).astype(float)
    consec = np.diff(np.round((tr.tk - tr.tk[0]) / tr.period)) == 1
    best = (1e9, 0.0)
    for lag in np.arange(0.0, 0.0201, 0.001):
        a = np.column_stack([tr.model_increments(x, lag) for x in (busy, 1.0 - busy)])[consec]
        y = np.diff(tr.ek)[consec]
        sol = np.linalg.lstsq(a, y, rcond=None)[0]
        rms = float(np.sqrt(np.mean((y - a @ sol) ** 2)))
        print(f"lag {lag * 1000:4.0f} ms: busy {sol[0]:.1f} W idle {sol[1]:.1f} W rms {rms:.3f} J")
        best = min(best, (rms, float(lag)))
    print(f"best lag {best[1] * 1000:.0f} ms (COUNTER_LAG_S)")
    return best[1]


def section_idle(data: Path, f: float, lag: float) -> None:
    print("== 4. idle power (the idle0 segment)")
    ws = [steady_w(Trace(data, p, f), "idle0", lag) for p in PROBES]
    print(
        " ".join(f"{w:.1f}" for w in ws),
        f"median {np.median(ws):.1f} W = {np.median(ws) / 700:.4f} of 700 W",
    )


def section_field(data: Path, f: float) -> None:
    print("== 5. instant power field")
    ivs, n_int, n_skip = [], 0, 0
    for p in PROBES:
        tr = Trace(data, p, f)
        po = tr.polls
        read = po["t0_s"] + f * (po["t1_s"] - po["t0_s"])
        w = po["power_instant_mw"] / 1000
        idx = np.nonzero(np.diff(w) != 0)[0] + 1
        t, v = 0.5 * (read[idx - 1] + read[idx]), w[idx]
        busy = np.isin(tr.kind, BUSY)
        frac = np.array([busy[tr._i(a) : tr._i(b)].mean() for a, b in zip(t[:-1], t[1:])])
        ok = (v[1:] > 300) & (v[:-1] > 300) & (frac > 0.9)
        iv = np.diff(t)[ok]
        ivs.append(iv[iv < 0.15])
        n_int, n_skip = n_int + ok.sum(), n_skip + (iv >= 0.15).sum()
        if p == "probe1":
            first = min(s["a"] for s in tr.segs if s["label"].startswith("sq"))
            last = max(s["b"] for s in tr.segs if s["label"].startswith("sq"))
            sel = (t > first) & (t < last)
            cum = np.concatenate([[0.0], np.cumsum(np.where(busy, 676.0, 123.0)) * DT])
            best = (1e9, 0.0, 0.0)
            for win in np.arange(0.01, 0.081, 0.005):
                for lag in np.arange(0.0, 0.0301, 0.0025):
                    b = ((t[sel] - lag - tr.t0) / DT).astype(int)
                    pred = (cum[b] - cum[b - int(win / DT)]) / win
                    best = min(best, (float(np.sqrt(np.mean((pred - v[sel]) ** 2))), win, lag))
            print(
                f"probe1 square waves: window {best[1] * 1000:.0f} ms, "
                f"lag {best[2] * 1000:.1f} ms, rms {best[0]:.1f} W"
            )
    iv = np.concatenate(ivs) * 1000
    q = np.percentile(iv, np.arange(0, 101, 5))
    print(f"intervals (ms, n={len(iv)}): mean {iv.mean():.2f} sd {iv.std():.2f}")
    print("quantiles 0..100 step 5:", ", ".join(f"{x:.1f}" for x in q))
    print(f"skipped updates {n_skip} of {n_int} ({n_skip / n_int:.4f})")


def section_limiter(data: Path, f: float, lag: float) -> None:
    print("== 6. power limiter: back-to-back forwards at the 700 W cap (W per 100 ms update)")
    cases = [
        ("probe2", "mlp4096:steady-forward"),
        ("probe3", "mlp4096:steady-forward"),
        ("probe3", "mlp4096:steady-forward-after"),
        ("probe4", "mlp4096:steady-forward"),
        ("probe4", "mlp4096:steady-forward-after"),
    ]
    shared = [
        (w, x, h) for w in (0.8, 0.9, 1.0) for x in (0.8, 0.85, 0.9) for h in (0.0, 0.01, 0.02)
    ]
    fits: Dict[tuple, List[tuple]] = {c: [] for c in shared}  # per shared setting: best per case
    for p, label in cases:
        tr = Trace(data, p, f)
        seg = next(s for s in tr.segs if s["label"] == label)
        idle_w = tr.window_w(seg["a"] - 0.5, seg["a"], lag)[2]
        ks = np.nonzero((tr.tk - lag >= seg["a"]) & (tr.tk - lag <= seg["b"]))[0]
        obs = np.diff(tr.ek[ks]) / np.diff(tr.tk[ks])
        for win, x, h in shared:
            best = (1e9, 0.0, 0)
            for pu in range(700, 781, 10):
                cum = np.concatenate(
                    [[0.0], np.cumsum(_limited(tr, seg, pu, idle_w, win, x, h)) * DT]
                )
                e = cum[((tr.tk[ks] - lag - tr.t0) / DT).astype(int)]
                sim = np.diff(e) / np.diff(tr.tk[ks])
                rms = float(np.sqrt(np.mean((sim - obs) ** 2)))
                best = min(best, (rms, float(sim.mean() - obs.mean()), pu))
            fits[(win, x, h)].append((p, label, *best))
    (win, x, h), rows = min(fits.items(), key=lambda kv: float(np.mean([r[2] for r in kv[1]])))
    print(f"window {win} s, held down to {x} of the cap, released below {1 - h:.2f} of it:")
    for p, label, rms, bias, pu in rows:
        print(f"  {p} {label}: unthrottled {pu} W, rms {rms:.1f} W, mean {bias:+.1f} W")


def _limited(
    tr: Trace, seg: dict, pu: float, idle_w: float, win: float, x: float, h: float
) -> np.ndarray:
    pw = np.full(len(tr.t), idle_w)
    a, b, n = tr._i(seg["a"]), tr._i(seg["b"]), int(win / DT)
    cum = np.concatenate([[0.0], np.cumsum(pw) * DT])
    i, throttled, step = a, False, int(0.01135 / DT)
    while i < b:
        avg = (cum[i] - cum[max(i - n, 0)]) / win
        throttled = avg >= 700 if not throttled else avg > 700 * (1 - h)
        p = x * 700 if throttled else pu
        j = min(i + step, b)
        pw[i:j] = p
        cum[i + 1 : j + 1] = cum[i] + np.arange(1, j - i + 1) * p * DT
        i = j
    return pw


def section_pattern(data: Path, f: float, lag: float) -> None:
    print("== 7. steady powers against 1F1B stage 0 (window power, W)")
    for p in ("probe3", "probe4"):
        tr = Trace(data, p, f)
        st = {
            k: steady_w(tr, lab, lag)
            for k, lab in [
                ("forward", "mlp4096:steady-forward"),
                ("backward", "mlp4096:steady-backward"),
                ("idle", "idle0"),
            ]
        }
        steady = np.full(len(tr.t), st["idle"])
        for k in ("forward", "backward"):
            steady[tr.kind == k] = st[k]
        capped = steady.copy()  # a stamp longer than the work: GPU idle for the rest
        stage = [s for s in tr.segs if ":stage0:" in s["label"]]
        for k in ("forward", "backward"):
            d = np.median(
                [
                    s["b"] - s["a"]
                    for s in stage
                    if s["kind"] == k and not s["label"].endswith("step0")
                ]
            )
            for s in stage:
                if s["kind"] == k and s["b"] - s["a"] > 1.2 * d:
                    capped[tr._i(s["a"]) : tr._i(s["b"])] = st["idle"]
                    capped[tr._i(s["b"] - d) : tr._i(s["b"])] = st[k]
        print(f"{p} steady: " + ", ".join(f"{k} {v:.1f}" for k, v in st.items()))
        for first in (0, 1):
            a = min(s["a"] for s in stage if s["label"].endswith(f"step{first}"))
            b = max(s["b"] for s in stage)
            i, j, meas = tr.window_w(a, b, lag)
            ps, pc = tr.predicted_w(steady, i, j, lag), tr.predicted_w(capped, i, j, lag)
            print(
                f"  steps {first}-9 ({tr.tk[j] - tr.tk[i]:.1f} s): measured {meas:.1f}, steady "
                f"powers {ps:.1f} ({(meas / ps - 1) * 100:+.1f} %), stalls at idle {pc:.1f} "
                f"({(meas / pc - 1) * 100:+.1f} %)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "h100-nvml")
    ap.add_argument("--write", action="store_true", help="regenerate the read-latency table")
    args = ap.parse_args()
    f = section_counter(args.data)
    section_latency(args.data, f, args.write)
    lag = section_lag(args.data, f)
    section_idle(args.data, f, lag)
    section_field(args.data, f)
    section_limiter(args.data, f, lag)
    section_pattern(args.data, f, lag)


if __name__ == "__main__":
    main()
