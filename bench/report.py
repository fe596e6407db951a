#!/usr/bin/env python3
"""report.py - Markdown report of a peers.sh run with cloakfs's ratios to every other column.

Usage: report.py [--subject FS] [--agg best|median] [--out-dir DIR] [--stamp STAMP] RESULTS_DIR

RESULTS_DIR is a ../shared/bench/peers.sh results directory (as written by bench/run.sh):
  <fs>.r<N>.txt          fsbench lines "workload value unit" + peers.sh's run-info lines
  versions-r<N>.txt      machine and peer versions (peers.sh)
  run-info.txt           command, commit, FSB_* overrides (bench/run.sh)
  <fs>.r<N>.mem          daemon peak RSS / threads (bench/hooks.sh sampler)
  cpu-seq_write/, cpu-seq_write+seq_read/   streaming CPU pass (bench/run.sh)
  steal.log              "epoch steal_ticks all_ticks" every 2 s (bench/run.sh), with
                         peers.log's timestamps: the host's CPU steal during each round

Prints the report and, with --out-dir, writes DIR/<stamp>.md and DIR/latest.md, where <stamp>
is the run's start (UTC) as YYYY-MM-DD-HHMM; a run on a shared store (run-info.txt's "store:"
line, bench/run.sh --store) writes DIR/<stamp>-<store>.md and DIR/latest-<store>.md instead.
The ratio table compares --subject (default cloakfs) with every other file system; ratios are
cost ratios (subject time / other time; for rate lines other rate / subject rate), so <= 1.00
always means the subject is as fast or faster.
/work/shared/bench/summarize.py (or ../shared/bench next to the repo) is appended if found.
Python 3 standard library only.
"""
import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys

ORDER = ["plain", "passthrough", "gocryptfs", "securefs", "encfs", "cryfs"]
ENCRYPTING = ["gocryptfs", "securefs", "encfs", "cryfs"]
WL_ORDER = ["seq_write", "seq_read", "rand_rw", "rand_rw_read", "rand_rw_write",
            "small_create", "small_read", "readdir", "untar", "tree_stat", "tree_md5",
            "tree_rm", "postmark", "postmark_tps", "compile_configure", "compile_make",
            "compile"]
INFO = ["wall", "bench_cpu", "daemon_cpu", "foreign_cpu"]
HIGHER = {"MB/s", "IOPS", "tx/s"}
STREAMING = ["seq_write", "seq_read"]
STORE_NAMES = {"gluster": "GlusterFS (replica-2 volume, FUSE client)",
               "sshfs": "sshfs (sshd on 127.0.0.1)"}
FSB_DEFAULTS = {  # fsbench.sh / peers.sh defaults, to flag reduced-size runs
    "FSB_SEQ_MB": "1024", "FSB_RAND_MB": "256", "FSB_RAND_SECS": "20", "FSB_RAND_JOBS": "2",
    "FSB_NSMALL": "1024", "FSB_SMALL_KB": "8", "FSB_SMALL_READS": "1024", "FSB_LS_REPS": "100",
    "FSB_PM_FILES": "20000", "FSB_PM_TX": "100000", "FSB_PM_SUBDIRS": "10",
}


def read_results(res):
    """(data, units, fails, fss): data[(fs, wl)] = [(round, value)], fails[(fs, wl)] = [str]."""
    data, units, fails, fss = {}, {}, {}, set()
    if not os.path.isdir(res):
        return data, units, fails, fss
    for fn in sorted(os.listdir(res)):
        m = re.match(r"(.+)\.r(\d+)\.txt$", fn)
        if not m or m.group(1) in ("versions", "cipher-limit"):
            continue
        fs, rnd = m.group(1), int(m.group(2))
        fss.add(fs)
        with open(os.path.join(res, fn), errors="replace") as f:
            for line in f:
                p = line.split()
                if len(p) < 2 or line.startswith("#"):
                    continue
                wl, val = p[0], p[1]
                unit = p[2] if len(p) > 2 else ""
                try:
                    v = float(val)
                except ValueError:
                    fails.setdefault((fs, wl), []).append(f"r{rnd}:{val}")
                    continue
                units[wl] = unit
                data.setdefault((fs, wl), []).append((rnd, v))
    return data, units, fails, fss


def read_kv(path):
    """'key: value' lines of a file; repeated keys keep the first value."""
    kv = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    kv.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return kv


MACHINE_KEYS = ("date", "kernel", "nproc", "cpu flags", "cpu", "mem", "backing fs")


def read_versions(path):
    """peers.sh's versions-r<N>.txt: (machine facts by key, other lines = package versions)."""
    ver, lines = {}, []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                for k in MACHINE_KEYS:
                    if line.startswith(k + ":"):
                        ver.setdefault(k, line[len(k) + 1:].strip())
                        break
                else:
                    lines.append(line)
    except OSError:
        pass
    return ver, lines


STEAL_WARN = 5.0  # percent of CPU time stolen by the host above which a round is flagged


def read_steal(res):
    """steal[(fs, round)] = percent of CPU time stolen while fsbench ran on fs in that round,
    from steal.log (epoch samples) and the "fsbench on" / "unmount" lines of peers.log."""
    try:
        with open(os.path.join(res, "steal.log")) as f:
            fields = [line.split() for line in f]
        samples = [tuple(map(int, p)) for p in fields
                   if len(p) == 3 and all(x.isdigit() for x in p)]
        with open(os.path.join(res, "peers.log"), errors="replace") as f:
            log = f.read().splitlines()
    except OSError:
        return {}
    if len(samples) < 2:
        return {}
    # peers.log has local times of day: place them after the first sample, rolling over
    # midnight whenever a time goes backwards.
    start = datetime.datetime.fromtimestamp(samples[0][0])
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    prev = start - datetime.timedelta(minutes=5)
    windows, open_ = {}, {}
    for line in log:
        m = re.match(r"# \[(\d\d):(\d\d):(\d\d)\] === (\S+) round (\d+): (fsbench on|unmount)", line)
        if not m:
            continue
        t = day + datetime.timedelta(hours=int(m.group(1)), minutes=int(m.group(2)),
                                     seconds=int(m.group(3)))
        while t < prev - datetime.timedelta(hours=1):
            day += datetime.timedelta(days=1)
            t += datetime.timedelta(days=1)
        prev = t
        key = (m.group(4), int(m.group(5)))
        if m.group(6) == "fsbench on":
            open_[key] = t.timestamp()
        elif key in open_:
            windows[key] = (open_.pop(key), t.timestamp())
    steal = {}
    for key, (t0, t1) in windows.items():
        inside = [s for s in samples if t0 - 2 <= s[0] <= t1 + 2]
        if len(inside) >= 2 and inside[-1][2] > inside[0][2]:
            steal[key] = 100.0 * (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])
    return steal


def read_mem(res):
    """mem[fs] = list of (round, peak_rss_kib, max_threads)."""
    mem = {}
    if not os.path.isdir(res):
        return mem
    for fn in sorted(os.listdir(res)):
        m = re.match(r"(.+)\.r(\d+)\.mem$", fn)
        if not m:
            continue
        vals = {}
        with open(os.path.join(res, fn)) as f:
            for line in f:
                p = line.split()
                if len(p) == 2 and p[1].isdigit():
                    vals[p[0]] = int(p[1])
        if "peak_rss_kib" in vals:
            mem.setdefault(m.group(1), []).append(
                (int(m.group(2)), vals["peak_rss_kib"], vals.get("max_threads")))
    return mem


def fmt(v):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if v < 1 else f"{v:.2f}"


def table(out, rows, header):
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    out.append("")


def find_summarize():
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.environ.get("SHARED_BENCH", ""), os.path.join(here, "..", "..", "shared", "bench"),
              "/work/shared/bench"):
        p = os.path.join(d, "summarize.py") if d else ""
        if p and os.path.isfile(p):
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--subject", default="cloakfs")
    ap.add_argument("--agg", choices=["best", "median"], default="best")
    ap.add_argument("--out-dir")
    ap.add_argument("--stamp")
    a = ap.parse_args()
    res = os.path.abspath(a.results)
    if not os.path.isdir(res):
        sys.exit(f"report.py: no directory {res}")

    data, units, fails, fss = read_results(res)
    if not fss:
        sys.exit(f"report.py: no <fs>.r<N>.txt results in {res}")
    cols = [f for f in ORDER if f in fss] + sorted(fss - set(ORDER))
    wls = [w for w in WL_ORDER if w in units or any(k[1] == w for k in fails)]
    wls += sorted({k[1] for k in list(data) + list(fails)} - set(WL_ORDER) - set(INFO))
    rounds = sorted({r for v in data.values() for r, _ in v})
    steal = read_steal(res)

    vfile = sorted(f for f in os.listdir(res) if re.match(r"versions-r\d+\.txt$", f))
    ver, vlines = read_versions(os.path.join(res, vfile[0])) if vfile else ({}, [])
    info = read_kv(os.path.join(res, "run-info.txt"))
    env = {}
    try:
        with open(os.path.join(res, "run-info.txt")) as f:
            for line in f:
                m = re.match(r"env: (FSB_\w+)=(.*)$", line.rstrip("\n"))
                if m:
                    env[m.group(1)] = m.group(2)
    except OSError:
        pass

    def pick(fs, wl):
        vals = [v for _, v in data.get((fs, wl), [])]
        if not vals:
            return None
        if a.agg == "median":
            return statistics.median(vals)
        return max(vals) if units.get(wl) in HIGHER else min(vals)

    def cell(fs, wl):
        s = fmt(pick(fs, wl))
        if (fs, wl) in fails:
            s += " (FAIL " + ",".join(fails[(fs, wl)]) + ")"
        return s

    def cost_ratio(subj, other, wl):
        """subject cost / other cost; <= 1 means the subject is as fast or faster."""
        s, o = pick(subj, wl), pick(other, wl)
        if s is None or o is None or s == 0 or o == 0:
            return None
        return o / s if units.get(wl) in HIGHER else s / o

    # ------------------------------------------------------------------ header
    date = ver.get("date") or info.get("started") or \
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    m = re.match(r"(\d{4}-\d{2}-\d{2})T(\d{2}):(\d{2})", date)
    stamp = a.stamp or (f"{m.group(1)}-{m.group(2)}{m.group(3)}" if m else
                        datetime.datetime.now().strftime("%Y-%m-%d-%H%M"))
    store = info.get("store", "")
    title = f"on {STORE_NAMES.get(store, store)}, " if store else ""
    out = [f"# cloakfs file-system benchmark {title}{date.replace('T', ' ')}", ""]
    cpu = ver.get("cpu") or platform.processor() or "unknown"
    out.append(f"- **Machine**: {cpu.strip()}; {ver.get('nproc', os.cpu_count())} cores"
               f"{'; ' + ver['mem'] + ' memory' if 'mem' in ver else ''}"
               f"; CPU flags: {ver.get('cpu flags', '?').strip() or 'none of aes/avx2/...'}")
    out.append(f"- **Kernel**: {ver.get('kernel', platform.release())}; "
               f"**backing fs**: {ver.get('backing fs', 'unknown')}")
    if a.subject in fss:
        dirty = info.get("repo_dirty_files", "?")
        out.append(f"- **{a.subject}**: commit {info.get('repo_commit', '?')}"
                   f"{' + ' + dirty + ' uncommitted files' if dirty not in ('0', '?') else ''}"
                   f"; {info.get('cloakfs_version') or 'version unknown'}"
                   f"; mount opts: `{info.get('cloakfs_mount_opts') or 'default'}`"
                   f"; {info.get('rustc', '')}")
    if store:
        out.append(f"- **Store**: {STORE_NAMES.get(store, store)}, set up by "
                   f"`scripts/shared-store.sh up {store}` on {info.get('store_disk', '?')}; "
                   f"every file system's volume lives on the client mount "
                   f"`{info.get('store_client', '?')}`; settings: "
                   f"{info.get('store_settings', '?').replace(';', '; ')}; "
                   f"{info.get('store_versions', '').rstrip('; ')}. foreign_cpu (below) "
                   f"includes the store's own processes (client, bricks or sshd), which serve "
                   f"every column.")
    if info.get("gocryptfs_mount_opts", "").strip():
        out.append(f"- **gocryptfs**: mount opts `{info['gocryptfs_mount_opts'].strip()}`")
    if info.get("fuse_io_uring"):
        out.append(f"- **FUSE over io_uring**: {info['fuse_io_uring']} (cloakfs uses the rings"
                   " when the kernel offers them; see its log line)")
    if vlines:
        out.append("- **Versions**: " + "; ".join(vlines))
    out.append(f"- **Run**: `{info.get('command', 'peers.sh')}`; {len(rounds)} round(s), "
               f"{a.agg} of rounds; raw results in `{res}`")
    # A store run has smaller defaults of its own (bench/run.sh --store): reduced is below those.
    defaults = dict(FSB_DEFAULTS)
    defaults.update(kv.split("=", 1) for kv in info.get("store_defaults", "").split() if "=" in kv)
    reduced = {k: v for k, v in env.items() if k in defaults and v != defaults[k]}
    if "FSB_WORKLOADS" in env:
        out.append(f"- **Workloads**: `{env['FSB_WORKLOADS']}` (a subset)")
    if reduced:
        out.append("- **Reduced sizes, not comparable with full-size runs**: " +
                   ", ".join(f"{k}={v}" for k, v in sorted(reduced.items())))
    if info.get("store_defaults"):
        out.append(f"- **Store defaults** (bench/run.sh --store): `{info['store_defaults']}`")
    out.append("")

    # ------------------------------------------------------------------ results
    out.append(f"## Results ({a.agg} of rounds)\n")
    table(out, [[wl, units.get(wl, ""), "higher" if units.get(wl) in HIGHER else "lower"] +
                [cell(f, wl) for f in cols] for wl in wls],
          ["workload", "unit", "better"] + cols)

    # ------------------------------------------------------------------ ratios
    subj = a.subject
    others = [f for f in cols if f != subj]
    enc = [f for f in others if f in ENCRYPTING]
    out.append(f"## {subj} vs. every other file system\n")
    if subj not in fss:
        out.append(f"{subj} was not part of this run: no ratios.\n")
    else:
        out.append(
            f"Cost ratio = time {subj} needs / time the other needs for the same work: for time "
            f"lines (s) `{subj}_s / other_s`, for rate lines (MB/s, IOPS, tx/s) `other_rate / "
            f"{subj}_rate`. **<= 1.00: {subj} is as fast or faster**; 1.25: {subj} needs 25% "
            f"more time (has 80% of the other's rate). Bold: {subj} slower than an encrypting "
            f"peer.\n")
        rows, losing = [], []
        for wl in wls:
            row = [wl, units.get(wl, "")]
            for f in others:
                r = cost_ratio(subj, f, wl)
                s = "-" if r is None else f"{r:.2f}"
                if r is not None and r > 1.0 and f in enc:
                    s = f"**{s}**"
                row.append(s)
            peer_r = {f: cost_ratio(subj, f, wl) for f in enc}
            known = {f: r for f, r in peer_r.items() if r is not None}
            if pick(subj, wl) is None:
                verdict = "FAIL" if (subj, wl) in fails else "-"
            elif not known:
                verdict = "-"
            else:
                worst = max(known, key=known.get)
                if known[worst] <= 1.0:
                    verdict = "yes"
                else:
                    verdict = f"no ({worst} {known[worst]:.2f})"
                    losing.append(f"{wl} ({worst} {known[worst]:.2f})")
                if len(known) < len(peer_r):
                    verdict += " (some peers missing)"
            row.append(verdict)
            rows.append(row)
        table(out, rows, ["workload", "unit"] + [f"vs {f}" for f in others] +
              ["as fast as every encrypting peer?"])

        # issue 3 targets
        out.append("### Targets (issue 25: the fastest encrypting file system on the store)\n"
                   if store else "### Targets (issue 3)\n")
        noisy = [f"{f} r{r} {v:.0f}%" for (f, r), v in sorted(steal.items()) if v > STEAL_WARN]
        if noisy:
            out.append(f"- **Noisy run**: the host took more than {STEAL_WARN:.0f}% of the CPU "
                       f"(steal) during " + ", ".join(noisy) + "; those rounds are not "
                       f"comparable with quiet ones.")
        if enc:
            if losing:
                out.append(f"- Lines where {subj} is slower than an encrypting peer (worst cost "
                           f"ratio): " + ", ".join(losing) + ".")
            else:
                out.append(f"- {subj} is as fast as or faster than every encrypting peer "
                           f"({', '.join(enc)}) on every line measured.")
        if "plain" in cols and not store:  # issue 3's streaming target is for a local disk
            for wl in STREAMING:
                s, p = pick(subj, wl), pick("plain", wl)
                if s and p:
                    pct = 100.0 * s / p
                    ok = "meets" if pct >= 90.0 else "misses"
                    out.append(f"- {wl}: {s:.0f} MB/s = {pct:.0f}% of the plain directory's "
                               f"{p:.0f} MB/s ({ok} the within-10% target).")
        out.append("")

    # ------------------------------------------------------------------ memory and CPU
    out.append("## Daemon memory and CPU\n")
    mem = read_mem(res)
    seq_mb = float(env.get("FSB_SEQ_MB", FSB_DEFAULTS["FSB_SEQ_MB"]))
    gb = seq_mb * 1048576 / 1e9
    cpu_w, _, _, _ = read_results(os.path.join(res, "cpu-seq_write"))
    cpu_wr, _, _, _ = read_results(os.path.join(res, "cpu-seq_write+seq_read"))

    def dcpu(d, fs):
        v = [x for _, x in d.get((fs, "daemon_cpu"), [])]
        return min(v) if v else None

    rows = []
    for f in cols:
        if f == "plain":
            continue
        m_ = mem.get(f, [])
        peak = max((p for _, p, _ in m_), default=None)
        thr = max((t for _, _, t in m_ if t is not None), default=None)
        per_round = " / ".join(fmt(v) for _, v in sorted(data.get((f, "daemon_cpu"), []))) or "-"
        w, wr = dcpu(cpu_w, f), dcpu(cpu_wr, f)
        w_gb = f"{w / gb:.2f}" if w is not None else "-"
        r_gb = f"{max(wr - w, 0.0) / gb:.2f}" if w is not None and wr is not None else "-"
        rows.append([f"**{f}**" if f == subj else f,
                     f"{peak / 1024:.1f}" if peak is not None else "-",
                     str(thr) if thr is not None else "-", per_round, w_gb, r_gb])
    table(out, rows, ["fs", "peak RSS MiB (VmHWM, max of rounds)", "max threads",
                      "daemon CPU s per round (whole fsbench run)",
                      "seq_write daemon CPU s/GB", "seq_read daemon CPU s/GB"])
    out.append(f"Peak RSS: VmHWM of the daemon sampled every 0.5 s until it exits (bench/hooks.sh). "
               f"CPU s/GB: daemon user+sys seconds per 10^9 bytes, from the streaming CPU pass "
               f"(one round each of FSB_WORKLOADS=\"seq_write\" and \"seq_write seq_read\" with "
               f"{seq_mb:.0f} MiB; read = difference of the two; peers.sh records daemon CPU to "
               f"0.1 s, so each figure is good to about {0.1 / gb:.2f} s/GB).")
    if not cpu_w:
        out.append(" The CPU pass did not run (`--no-cpu-pass`, or no seq_write in the workloads).")
    out.append("")

    # ------------------------------------------------------------------ noise
    rows = []
    for wl in INFO:
        if any((f, wl) in data for f in cols):
            rows.append([wl + " (s)"] + [" / ".join(fmt(v) for _, v in sorted(data.get((f, wl), [])))
                                         or "-" for f in cols])
    if steal:
        rows.append(["host steal (%)"] + [
            " / ".join(f"{steal[(f, r)]:.1f}" if (f, r) in steal else "-" for r in rounds)
            for f in cols])
    if rows:
        out.append("## Run info per round (r1 / r2 / ...)\n")
        out.append("foreign_cpu: busy CPU-seconds during the run not used by fsbench or the "
                   "daemon (other tenants, kernel threads); large values mean a noisy run. "
                   "host steal: share of the VM's CPU time the host gave to other guests while "
                   "fsbench ran (bench/run.sh's sampler).\n")
        table(out, rows, ["item"] + cols)

    # ------------------------------------------------------------------ appendix
    sp = find_summarize()
    if sp:
        try:
            s = subprocess.run([sys.executable, sp, res, "--agg", a.agg], capture_output=True,
                               text=True, timeout=60, check=True).stdout
            out.append("## Appendix: summarize.py\n")
            out.append(s.rstrip() + "\n")
        except (subprocess.SubprocessError, OSError) as e:
            out.append(f"(summarize.py failed: {e})\n")

    text = "\n".join(out).rstrip() + "\n"
    sys.stdout.write(text)
    if a.out_dir:
        os.makedirs(a.out_dir, exist_ok=True)
        tag = f"-{store}" if store else ""
        for name in (f"{stamp}{tag}.md", f"latest{tag}.md"):
            with open(os.path.join(a.out_dir, name), "w") as f:
                f.write(text)
        print(f"report.py: wrote {os.path.join(a.out_dir, stamp + tag + '.md')} and "
              f"latest{tag}.md", file=sys.stderr)


if __name__ == "__main__":
    main()
