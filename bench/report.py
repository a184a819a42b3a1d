"""results.json, a human-readable table (results.md, also printed) and the lag plot."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from .metrics import ratio


def _fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, float):
        v = f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
    elif isinstance(v, int):
        v = f"{v:,}"
    return f"{v}{unit}"


def _met(r, goal, higher_is_better):
    if r is None:
        return "-"
    return "yes" if (r >= goal if higher_is_better else r <= goal) else "**no**"


def table(res: dict) -> str:
    rows = []
    if h := res.get("host"):
        q, by = h["by_busy_processes"]["0"], h["by_busy_processes"]
        for n in [k for k in by if k != "0"]:
            rows.append((f"0. host: write latency p99 s with {n} busy process(es) at nice {h['nice']} vs none",
                         by[n]["p99"], q["p99"], h["ratio_p99"][n], "(context)", ""))
            rows.append(("   p50 s", by[n]["p50"], q["p50"], h["ratio_p50"][n], "(context)", ""))
    if d := res.get("dump"):
        rows.append(("1. dump rows/s (incl. spark-submit)", d["ours"]["rows_per_s"], d["baseline"]["rows_per_s"],
                     d["ratio"], f">= {d['goal']}", _met(d["ratio"], d["goal"], True)))
        rows.append(("   dump rows/s (excl. start-up)", d["ours"]["rows_per_s_excl_start"],
                     d["baseline"]["rows_per_s_excl_start"], d["ratio_excl_start"], "(context)", ""))
        if ser := d.get("ours_serial"):   # what the pipeline (dump.pipeline) gains, same run
            rows.append(("   dump rows/s (excl. start-up), pipelined vs one chunk after the other",
                         d["ours"]["rows_per_s_excl_start"], ser["rows_per_s_excl_start"],
                         d["ratio_pipelined_vs_serial"], "(context)", ""))
    if t := res.get("tail"):
        rows.append(("2. tail events/s vs bare library loop", t["ours"]["events_per_s"], t["baseline"]["events_per_s"],
                     t["ratio"], f">= {t['goal']}", _met(t["ratio"], t["goal"], True)))
        if ph := t.get("physical"):  # the physical limit (issue 30): the C decoder shipped with the database
            tool = ph["tool"] if ph["tool"] == "pg_recvlogical" else f"C decoder ({ph['tool']})"
            goal = t.get("goal_physical", 0.25)
            rows.append((f"   tail events/s vs {tool}", t["ours"]["events_per_s"], ph["events_per_s"],
                         t["ratio_physical"], f">= {goal}", _met(t["ratio_physical"], goal, True)))
        if lib := t.get("ours_library_decoder"):   # ours with the other decoder: what the default gains
            rows.append((f"   tail events/s, decoder {t['ours'].get('decoder')} vs {lib['decoder']}",
                         t["ours"]["events_per_s"], lib["events_per_s"],
                         round(t["ours"]["events_per_s"] / lib["events_per_s"], 3), "(context)", ""))
    if lg := res.get("lag"):
        L, W = lg["lag"], lg["impact"]
        rows.append(("3. log lag p99 s (dump vs none)", L["dump"]["p99"], L["no_dump"]["p99"], L["ratio_p99"],
                     f"<= {L['goal']}", _met(L["ratio_p99"], L["goal"], False)))
        rows.append(("   log lag p50 s", L["dump"]["p50"], L["no_dump"]["p50"], L["ratio_p50"], "(context)", ""))
        rows.append(("4. write latency p99 s (dump vs none)", W["dump"]["p99"], W["no_dump"]["p99"],
                     W["ratio_p99"], f"<= {W['goal']}", _met(W["ratio_p99"], W["goal"], False)))
        rows.append(("   write latency p50 s", W["dump"]["p50"], W["no_dump"]["p50"], W["ratio_p50"], "(context)", ""))
        rows.append(("   write latency p99 s, dump job's JVM start", W["dump_start"]["p99"], W["no_dump"]["p99"],
                     ratio(W["dump_start"]["p99"], W["no_dump"]["p99"]), "(context)", ""))
    if f := res.get("fresh"):
        s = f["freshness_s"]
        rows.append(("5. freshness commit->target s (p50 / p99)", f"{_fmt(s['p50'])} / {_fmt(s['p99'])}", "-", "-",
                     "(no baseline)", ""))
    if (dg := res.get("dags")) and (ev := dg["modes"].get("event")):
        cron = dg["modes"].get("cron") or {"freshness_s": {}}
        r = (dg.get("ratio_event_over_cron") or {})
        rows.append(("6. freshness through the DAGs p99 s (event vs cron)", ev["freshness_s"]["p99"],
                     cron["freshness_s"].get("p99"), r.get("p99"), "p99 < 15 s", _met(ev["freshness_s"]["p99"], 15, False)))
        rows.append(("   p50 s (event vs cron)", ev["freshness_s"]["p50"], cron["freshness_s"].get("p50"), r.get("p50"),
                     "(context)", ""))
    if v := res.get("verify"):
        rows.append(("7. verify rows/s vs raw Spark reads of both tables", v["ours"]["rows_per_s"],
                     v["baseline"]["rows_per_s"], v["ratio"], f">= {v['goal']}", _met(v["ratio"], v["goal"], True)))
        W = v["impact"]
        rows.append(("   write latency p99 s (verify vs none)", W["verify"]["p99"], W["no_verify"]["p99"],
                     W["ratio_p99"], f"<= {W['goal']}", _met(W["ratio_p99"], W["goal"], False)))
        rows.append(("   write latency p50 s (verify vs none)", W["verify"]["p50"], W["no_verify"]["p50"],
                     W["ratio_p50"], "(context)", ""))
        rows.append(("   write latency p99 s, whole verification (JVM start, compare)", W["whole_verification"]["p99"],
                     W["no_verify"]["p99"], W["ratio_p99_whole"], "(context)", ""))
    out = ["| metric | ours | baseline | ratio | goal | met |", "|---|---:|---:|---:|---|---|"]
    out += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]
    return "\n".join(out)


def markdown(res: dict) -> str:
    m = res["meta"]
    lines = [f"# dblog benchmark ({m['source']}, {m['started']})", "",
             f"args: `{m['args']}`  ", f"machine: {m['machine']}  ",
             f"Spark master (every Spark job, ours and the baseline's): {m.get('spark_master', 'local[2]')}",
             "", table(res), ""]
    if d := res.get("dump"):
        lines += [f"Dump: {d['rows']:,} rows, {d['chunks']} chunks of {d['chunk_size']:,}, parallelism "
                  f"{d['parallelism']}; ours {d['ours']['seconds']}s (JVM/session start and stop {d['ours']['overhead_s']}s, "
                  f"finishing chunks (wait for HW, reconcile, snapshot) {d['ours']['finish_chunk_s_total']}s), baseline {d['baseline']['seconds']}s "
                  f"(JVM/session start and stop {d['baseline']['overhead_s']}s).", ""]
        if p := d.get("profile"):
            lines += [f"Dump profile ({p['chunks']} chunks, {p['rows']:,} rows, driver run {p['run_s']}s, "
                      f"session start {p['session_s']}s), seconds per step:", "",
                      "| step | s |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in p["times"].items()] + [""]
            lines += ["select_chunk per chunk (s): " + ", ".join(str(x) for x in p["per_call"].get("step.select_chunk", [])),
                      "", "finish_chunk per chunk (s): " + ", ".join(str(x) for x in p["per_call"].get("step.finish_chunk", [])), ""]
    if t := res.get("tail"):
        lines += [f"Tail: {t['events']:,} row changes in transactions of {t['txn_rows']} rows; ours "
                  f"{t['ours']['seconds']}s in {t['ours']['flushes']} flushes, bare loop {t['baseline']['seconds']}s"
                  + (f", {ph['tool']} {ph['seconds']}s ({ph['events']:,} row changes counted in its output; "
                     f"{ph['version']})" if (ph := t.get("physical")) else "") + ".", ""]
        if p := t.get("profile"):
            lines += [f"Tail profile (cProfile, {p['seconds_under_profiler']}s under the profiler), own time "
                      "per file:", "", "| file | s |", "|---|---:|"]
            lines += [f"| {k} | {v} |" for k, v in p["by_file"].items()]
            lines += ["", "Top functions by own time:", "", "```"] + p["tottime"] + ["```", ""]
    if lg := res.get("lag"):
        lines += [f"Lag: {lg['writes']:,} writes at {lg['write_rate']}/s, {len(lg['windows'])} windows, "
                  f"tail flush_seconds {lg['tail_flush_seconds']}; writes not found in the changelog: "
                  f"{lg['writes_not_in_changelog']}. no_dump n={lg['lag']['no_dump']['n']}, "
                  f"dump n={lg['lag']['dump']['n']}. Plot: lag.png", ""]
    if f := res.get("fresh"):
        fs = f["freshness_s"]
        lines += [f"Freshness via {f['via']}: {f['writes_measured']:,} writes (committed between the first "
                  f"run's start and the one before the last's), p50 {fs['p50']}s, p90 {fs['p90']}s, p99 {fs['p99']}s, "
                  f"not applied by the last run {f['not_applied']}; apply runs took "
                  + ", ".join(f"{r.get('seconds')}s ({r.get('via') or '?'}, {r.get('events')} events)"
                              for r in f["apply_runs"]) + f". {f.get('note', '')}", ""]
    if dg := res.get("dags"):
        lines += [f"Freshness through the shipped DAGs in a running Airflow (scheduler, triggerer, LocalExecutor), "
                  f"single-row commits at {dg['rate_per_s']}/s, tail runs of {dg['tail_run_seconds']} s:", "",
                  "| apply_schedule | minutes | changes | p50 s | p90 s | p99 s | max s | apply runs | run s (p50 / max) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for m in dg["modes"].values():
            f, rs = m["freshness_s"], m["run_seconds"]
            lines.append(f"| `{m['apply_schedule']}` | {m['minutes']:g} | {f['n']} | {f['p50']} | {f['p90']} | {f['p99']} "
                         f"| {f['max']} | {m['apply_runs']} | {rs['p50']} / {rs['max']} |")
        lines.append("")
    if v := res.get("verify"):
        lines += [f"Verify: {v['rows']:,} rows (source and target), {'equal' if v['equal'] else '**NOT equal**'}: "
                  f"{v['compared']:,} rows compared, {v['skipped']:,} changing keys left out; ours {v['ours']['seconds']}s "
                  f"(chunks read {'in-process' if v.get('via') == 'local' else 'on Spark'}, target read, comparison), baseline {v['baseline']['seconds']}s (both tables read "
                  f"raw); {v['windows']} chunk windows over {v['windows_s']}s; write latency n={v['impact']['no_verify']['n']} "
                  f"quiet, n={v['impact']['verify']['n']} during the windows; "
                  f"apply errors {len(v['apply_errors'])}.", ""]
    return "\n".join(lines)


def plot(lg: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    s = lg["series"]
    t0 = s[0]["t"] if s else 0
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for ax in (ax1, ax2):
        for i, w in enumerate(lg["windows"]):
            if w["lw_t"] and w["hw_t"]:
                ax.axvspan(w["lw_t"] - t0, w["hw_t"] - t0, color="orange", alpha=0.3,
                           label="dump window LW->HW" if i == 0 else None)
        ax.axvline(lg["t_dump_submit"] - t0, color="grey", ls="--", label="dump job submitted")
        ax.axvline(lg["t_dump_end"] - t0, color="grey", ls=":", label="dump job ended")
    pts = [(x["t"] - t0, x["lag_s"]) for x in s if x["lag_s"] is not None]
    ax1.scatter([p[0] for p in pts], [p[1] for p in pts], s=2, color="tab:blue", label="commit -> changelog lag")
    ax1.set_ylabel("log lag (s)")
    ax1.legend(loc="upper left", fontsize=8)
    ax1.set_title("dblog tail lag and write latency, without and during a dump")
    ax2.scatter([x["t"] - t0 for x in s], [x["write_s"] * 1000 for x in s], s=2, color="tab:green",
                label="application write latency")
    ax2.set_ylabel("write latency (ms)")
    ax2.set_yscale("log")
    ax2.set_xlabel("seconds since the writer started")
    ax2.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(res: dict, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    if lg := res.get("lag"):
        series = lg.pop("series")
        with open(out / "lag_series.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["wseq", "t", "phase", "op", "write_s", "lag_s"])
            w.writeheader()
            w.writerows(series)
        lg["plot"] = "lag.png" if plot(lg | {"series": series}, out / "lag.png") else \
            "not drawn: pip install matplotlib"
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    md = markdown(res)
    (out / "results.md").write_text(md)
    return md
