#!/usr/bin/env python3
"""trace_summary.py — where a serving run's engine steps spend their time,
from the Chrome trace `hearth serve --trace-file` writes.

  python3 bench/cuda/trace_summary.py TRACE.json [--engine-out ENGINE.json]

For the engine's steps it prints, per kind of step (decode only, or with
prefill tokens) and size, the count, the mean step time, the mean forward
time (the batched forward and the sampling: the device's work plus its
launches and synchronisations) and the rest of the step (the scheduler's
host work: admission, block tables, sampling rows, then committing each
token), plus the engine's idle time between steps and the request threads'
detokenize / deliver time. --engine-out writes only the engine track's
events (small enough to keep beside the numbers).
"""
import json
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        text = f.read().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return json.loads(text)


def bucket(n):
    b = 1
    while b < n:
        b *= 2
    return b


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    path, eng_out = args[0], None
    if "--engine-out" in args:
        eng_out = args[args.index("--engine-out") + 1]
    ev = load(path)
    eng_tid = None
    for e in ev:
        if e.get("ph") == "X" and e.get("name") == "step":
            eng_tid = e.get("tid")
            break
    steps = sorted([e for e in ev if e.get("ph") == "X" and e.get("tid") == eng_tid and e["name"] == "step"], key=lambda e: e["ts"])
    fwds = sorted([e for e in ev if e.get("ph") == "X" and e.get("tid") == eng_tid and e["name"] == "forward"], key=lambda e: e["ts"])
    if not steps:
        print("no engine steps in the trace")
        return 1
    # pair each step with the forward inside it
    fi = 0
    rows = defaultdict(lambda: [0, 0.0, 0.0, 0, 0])  # count, step us, forward us, decode tokens, prefill tokens
    tot_step = tot_fwd = 0.0
    for s in steps:
        while fi < len(fwds) and fwds[fi]["ts"] < s["ts"]:
            fi += 1
        f = fwds[fi] if fi < len(fwds) and fwds[fi]["ts"] <= s["ts"] + s["dur"] else None
        a = s.get("args", {})
        dec, pre = a.get("decode_tokens", 0), a.get("prefill_tokens", 0)
        key = ("decode" if pre == 0 else "mixed", bucket(dec + pre))
        r = rows[key]
        r[0] += 1
        r[1] += s["dur"]
        r[2] += f["dur"] if f else 0.0
        r[3] += dec
        r[4] += pre
        tot_step += s["dur"]
        tot_fwd += f["dur"] if f else 0.0
    span = steps[-1]["ts"] + steps[-1]["dur"] - steps[0]["ts"]
    idle = span - tot_step
    print(f"engine: {len(steps)} steps over {span / 1e6:.2f} s: steps {tot_step / 1e6:.2f} s "
          f"(forward + sampling {tot_fwd / 1e6:.2f} s, host work outside it {(tot_step - tot_fwd) / 1e6:.2f} s), "
          f"idle between steps {idle / 1e6:.2f} s")
    print(f"{'kind':8} {'tokens<=':>8} {'steps':>6} {'step ms':>9} {'fwd ms':>9} {'host ms':>9} {'decode/step':>11} {'prefill/step':>12}")
    for key in sorted(rows):
        n, st, fw, dec, pre = rows[key]
        print(f"{key[0]:8} {key[1]:8d} {n:6d} {st / n / 1e3:9.2f} {fw / n / 1e3:9.2f} {(st - fw) / n / 1e3:9.2f} "
              f"{dec / n:11.1f} {pre / n:12.1f}")
    # the request threads
    per = defaultdict(lambda: [0, 0.0])
    for e in ev:
        if e.get("ph") == "X" and e.get("tid") != eng_tid and e.get("name") in ("detokenize", "deliver", "cache lookup"):
            p = per[e["name"]]
            p[0] += 1
            p[1] += e["dur"]
    for k, (n, us) in sorted(per.items()):
        print(f"request threads: {k}: {n} spans, {us / 1e6:.3f} s in all, {us / max(n, 1):.1f} us each")
    if eng_out:
        keep = [e for e in ev if e.get("tid") == eng_tid]
        with open(eng_out, "w") as f:
            json.dump(keep, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
