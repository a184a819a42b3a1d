"""The chaos loop's report (bench/chaos.py): faults injected and recovered, the engine's retry
counters from Redis, dumps, applies, rows written, the verifications after each fault (each
must be equal: a difference or an error is a failure), and the divergences per table."""
from __future__ import annotations

from collections import Counter


def report(h, minutes, chaos_s, finish_s, unfinished, drained, no_windows, apply_res, apply_error,
           divergences) -> dict:
    counters = h.state.counters()
    abandoned = sum(1 for w in h.state.closed_windows(10_000) if w.get("outcome") == "abandoned")
    injected = Counter(f["kind"] for f in h.faults if f["injected"])
    recovered = Counter(f["kind"] for f in h.faults if f["injected"] and f["recovered"])
    reqs = h.dumps.requests
    killed = [rid for rid, r in reqs.items() if r["killed"]]
    zombies = [f for f in h.faults if f["kind"] == "tail_zombie" and f["injected"]]
    bad = sum(v["missing"] + v["extra"] + v["different"] for v in divergences.values())
    checks = [f["verify"] for f in h.faults if "verify" in f]
    unequal = [c for c in checks if not c.get("equal")]
    res = {
        "minutes": minutes, "seed": h.seed, "source": h.kind,
        "chaos_seconds": round(chaos_s, 1), "finish_seconds": round(finish_s, 1),
        "faults_injected": dict(injected), "faults_recovered": dict(recovered),
        "faults_skipped": [f for f in h.faults if not f["injected"]],
        "recovery_s_max": max((f["recovery_s"] for f in h.faults if f["recovered"]), default=None),
        "recoveries": {
            "tail_starts": h.tail.starts, "tail_restarts": h.tail.starts - 1,
            "tail_exit_codes": dict(Counter(str(e["rc"]) for e in h.tail.exits)),
            "zombies_ended_by_themselves": sum(1 for z in zombies if z.get("zombie_ended_by_itself")),
            "tail_retries": counters.get("tail_retries", 0), "dump_retries": counters.get("dump_retries", 0),
            "apply_retries": counters.get("apply_retries", 0), "windows_abandoned": abandoned,
            "killed_dumps_completed": sum(1 for rid in killed if rid not in unfinished),
        },
        "dumps": {"requests": len(reqs), "completed": len(reqs) - len(unfinished),
                  "unfinished": unfinished, "killed": len(killed),
                  "runs": sum(r["runs"] for r in reqs.values()),
                  "by_scope": dict(Counter(r["scope"] for r in reqs.values())),
                  "submit_errors": h.dumps.submit_errors},
        "applies": {"runs_ok": len(h.applies.ok_starts), "errors": len(h.applies.errors),
                    "error_samples": h.applies.errors[:5]},
        "writer": {"transactions": h.writer.txns, "large_transactions": h.writer.big_txns,
                   "rows": h.writer.rows, "errors": h.writer.errors},
        "drained": drained, "no_open_windows": no_windows,
        "final_apply": {"ok": apply_res is not None, "error": apply_error},
        "divergences": divergences, "divergent_rows": bad,
        "verifications": {"runs": len(checks), "equal": len(checks) - len(unequal), "not_equal": unequal[:5],
                          "compared": sum(c.get("compared", 0) for c in checks),
                          "skipped": sum(c.get("skipped", 0) for c in checks)},
        "tail_exits": [e for e in h.tail.exits if "last_lines" in e][:10],
        "fault_log": h.faults,
    }
    res["ok"] = bool(bad == 0 and not unequal and drained and no_windows and apply_res is not None and not unfinished
                     and all(f["recovered"] for f in h.faults if f["injected"]))
    return res
