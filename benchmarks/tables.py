"""The benchmark suite's tables: read what a step's runs wrote, print one table, write it as JSON.

    python benchmarks/tables.py runs OUT NAME GLOB             trainer runs (GLOB/metrics.json under OUT)
    python benchmarks/tables.py throughput OUT NAME FILE...    bench throughput JSONs (one tag per file name)
    python benchmarks/tables.py pytest OUT NAME LOG...         pytest logs: passed / failed / skipped per file
    python benchmarks/tables.py ingp OUT NAME FILE [OURS]      instant-ngp's budgets (run_ingp.sh's JSON), ours beside
    python benchmarks/tables.py renders OUT NAME INGP OURS...  render time per test view: instant-ngp's (ingp_render.py)
                                                               and ours (hvd-ngp-render's render.json, one per path)
    python benchmarks/tables.py fields OUT NAME FILE...        the scalar fields of JSON files, one row each
    python benchmarks/tables.py rows OUT NAME FILE KEY         the list FILE[KEY], one row per entry (objects flattened)

Each writes ``OUT/NAME.json``: {"step": NAME, "rows": [...]} (plus "summary" where one is computed) and prints
the rows as a table. Exit status 1 when a pytest log shows a failure or no result, or a file names no rows.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from hvd_ngp.bench.report import table, write_json


def runs(out: Path, pattern: str) -> list[dict]:
    """One row per trainer output folder matching ``pattern`` under ``out`` (its metrics.json)."""
    rows = []
    for path in sorted(out.glob(f"{pattern}/metrics.json")):
        m = json.loads(path.read_text())
        rows.append({"run": path.parent.name, "steps": m["steps"], "train_s": m["train_seconds"],
                     "psnr": round(m["test_psnr"], 3), "views": m["test_views"],
                     "curve": " ".join(f"{c['seconds']:g}s:{c['psnr']:.2f}" for c in m.get("curve", [])),
                     "memory budget GiB": (m.get("memory") or {}).get("budget_gib"),
                     "memory peaks": json.dumps((m.get("memory") or {}).get("peak", {}))[:120]})
    return rows


def throughput(files: list[Path]) -> tuple[list[dict], dict]:
    """Rows of ``bench throughput`` JSONs (``training`` entries); the tag is the file name without a trailing
    ``_<round>``; summary: the median M samples/s per tag and backend over its rounds."""
    rows, rates = [], {}
    for f in files:
        tag = re.sub(r"_\d+$", "", f.stem)
        for r in json.loads(f.read_text())["training"]:
            rate = r["samples_per_sec"] / 1e6
            rows.append({"run": f.stem, "backend": r.get("backend", ""), "precision": r.get("precision", ""),
                         "M samples/s": round(rate, 2), "ms/step": round(r["step_ms"], 2),
                         "rays/step": round(r.get("rays_per_step", 0)), "GPU busy": r.get("gpu_busy_share", "")})
            rates.setdefault(f"{tag} {r.get('backend', '')}".strip(), []).append(rate)
    return rows, {k: {"median_M_samples_per_s": round(statistics.median(v), 2), "rounds": len(v)}
                  for k, v in rates.items()}


def pytest_logs(logs: list[Path]) -> list[dict]:
    """One row per pytest log: the counts of its closing line, and its failed test ids."""
    rows = []
    for log in logs:
        text = log.read_text(errors="replace")
        closing = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
        last = closing[-1] if closing else ""
        count = lambda word: int(m.group(1)) if (m := re.search(rf"(\d+) {word}", last)) else 0  # noqa: E731
        rows.append({"file": log.stem.removeprefix("pytest_"), "passed": count("passed"), "failed": count("failed"),
                     "errors": count("error"), "skipped": count("skipped"), "finished": bool(closing),
                     "failures": " ".join(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M))[:300]})
    return rows


def ingp(path: Path, ours: Path | None) -> list[dict]:
    """instant-ngp's rows (``ingp_timed.py``'s JSON: budgets, steps, psnr_white_1spp), with our PSNR at the
    same training seconds where ``ours`` (a ``runs`` table's JSON) has an evaluation within 10% of them."""
    data = json.loads(path.read_text())
    curve = []
    if ours is not None and ours.is_file():
        for row in json.loads(ours.read_text())["rows"]:
            for point in row["curve"].split():
                seconds, psnr = point.split("s:")
                curve.append((float(seconds), float(psnr), row["run"]))
    rows = []
    for budget, steps, psnr in zip(data["budgets"], data["steps"], data["psnr_white_1spp"]):
        near = [c for c in curve if abs(c[0] - budget) <= 0.1 * budget]
        rows.append({"seconds": budget, "instant-ngp steps": steps, "instant-ngp dB": round(psnr, 3),
                     "ours dB": " ".join(f"{p:.3f} ({run})" for _, p, run in near) or "n/a"})
    return rows


def renders(anchor: Path, ours: list[Path]) -> tuple[list[dict], dict]:
    """One row per renderer: PSNR and seconds per test view, instant-ngp's (``ingp_render.py``'s JSON) first, then
    ours (the render tool's ``render.json``, one per inference path); both the mean over all views and the mean
    after the first view (each process's first render pays its set-up), each as a multiple of instant-ngp's;
    summary: each of ours as those multiples and its PSNR difference."""
    a = json.loads(anchor.read_text())
    a_later = a.get("seconds_per_view_after_first", a["seconds_per_view"])
    rows = [{"renderer": "instant-ngp", "views": a["views"], "psnr": a["psnr_white_1spp"],
             "s/view": a["seconds_per_view"], "x instant-ngp": 1.0,
             "s/view after the first": a_later, "x after the first": 1.0}]
    for f in ours:
        r = json.loads(f.read_text())
        mean = r["test_seconds_per_view"]
        later = r.get("test_seconds_per_view_after_first", mean)
        march = r.get("marching") or {}
        how = f" ({march['eval_steps_per_diagonal']} steps, stop at {march['early_termination']:g})" if march else ""
        rows.append({"renderer": f"hvd_ngp {r.get('inference') or f.stem}{how}", "views": r["test_views"],
                     "psnr": round(r["test_psnr"], 3), "s/view": round(mean, 4),
                     "x instant-ngp": round(mean / a["seconds_per_view"], 2),
                     "s/view after the first": round(later, 4), "x after the first": round(later / a_later, 2)})
    summary = {row["renderer"]: {"x_instant_ngp": row["x instant-ngp"],
                                 "x_instant_ngp_after_first": row["x after the first"],
                                 "psnr_minus_instant_ngp": round(row["psnr"] - a["psnr_white_1spp"], 3)}
               for row in rows[1:]}
    return rows, summary


def fields(files: list[Path]) -> list[dict]:
    """The top-level numbers, strings and booleans of each JSON file (lists and objects left out)."""
    return [{"file": f.stem, **{k: v for k, v in json.loads(f.read_text()).items()
                                if isinstance(v, (int, float, str, bool)) and not isinstance(v, dict)}}
            for f in files]


def rows_of(path: Path, key: str) -> list[dict]:
    """The entries of the list ``key`` in a JSON file; an entry's objects become ``outer.inner`` columns."""
    rows = []
    for entry in json.loads(path.read_text())[key]:
        row = {}
        for k, v in entry.items():
            if isinstance(v, dict):
                row.update({f"{k}.{inner}": value for inner, value in v.items()})
            elif not isinstance(v, list):
                row[k] = v
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    kind, out, name, rest = argv[0], Path(argv[1]), argv[2], argv[3:]
    summary = None
    if kind == "runs":
        rows = runs(out, rest[0])
    elif kind == "throughput":
        rows, summary = throughput([Path(f) for f in rest])
    elif kind == "pytest":
        rows = pytest_logs([Path(f) for f in rest])
    elif kind == "ingp":
        rows = ingp(Path(rest[0]), Path(rest[1]) if len(rest) > 1 else None)
    elif kind == "renders":
        rows, summary = renders(Path(rest[0]), [Path(f) for f in rest[1:]])
    elif kind == "fields":
        rows = fields([Path(f) for f in rest])
    elif kind == "rows":
        rows = rows_of(Path(rest[0]), rest[1])
    else:
        print(f"tables.py: unknown table {kind!r} (runs, throughput, pytest, ingp, renders, fields, rows)", file=sys.stderr)
        return 2
    columns = list(dict.fromkeys(k for r in rows for k in r))
    print(f"{name}:\n{table(rows, columns) if rows else '(no results)'}")
    if summary and kind == "throughput":
        for key, value in summary.items():
            print(f"  {key}: {value['median_M_samples_per_s']} M samples/s (median of {value['rounds']})")
    write_json(out / f"{name}.json", {"step": name, "rows": rows, **({"summary": summary} if summary else {})})
    bad = not rows or (kind == "pytest" and any(r["failed"] or r["errors"] or not r["finished"] for r in rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
