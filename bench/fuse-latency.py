#!/usr/bin/env python3
"""Time spent in each kind of FUSE request, from the kernel's own tracepoints.

Where bench/fuse-requests.py counts requests, this times them: from the moment the kernel
queues a request (tracepoint fuse:fuse_request_send) to the moment the daemon's reply ends it
(fuse:fuse_request_end), so each time covers the daemon's work and both hand-overs. It costs
the daemon nothing (no strace), so the times are real, for cloakfs or any peer:

    perf record -q -o DATA -e fuse:fuse_request_send,fuse:fuse_request_end -a -- WORKLOAD
    perf script -i DATA > TXT
    bench/fuse-latency.py TXT            # per opcode: count, total s, mean, p50, p99, max
    bench/fuse-latency.py TXT MKDIR      # one opcode only

Requests of every FUSE connection in the trace are counted (keep other FUSE mounts idle).
A request sent before the recording started or ended after it is left out. Background
requests (writeback WRITEs, RELEASE) do not always hold up the workload, so the total of a
line is the time the kernel waited for the daemon, not the time the workload lost.
"""

import collections
import re
import signal
import sys

SEND = re.compile(
    r"\s(\d+\.\d+):\s+fuse:fuse_request_send: connection (\d+) req (\d+) opcode \d+ \((\w+)\)"
)
END = re.compile(r"\s(\d+\.\d+):\s+fuse:fuse_request_end: connection (\d+) req (\d+)")


def latencies(lines):
    """Seconds from send to end, per opcode name (without the FUSE_ prefix)."""
    sent = {}
    out = collections.defaultdict(list)
    for line in lines:
        m = SEND.search(line)
        if m:
            sent[(m.group(2), m.group(3))] = (float(m.group(1)), m.group(4).removeprefix("FUSE_"))
            continue
        m = END.search(line)
        if m:
            started = sent.pop((m.group(2), m.group(3)), None)
            if started:
                out[started[1]].append(float(m.group(1)) - started[0])
    return out


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: fuse-latency.py PERF_SCRIPT_OUTPUT [OPCODE]")
    try:
        with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
            lat = latencies(f)
    except OSError as e:
        sys.exit(f"fuse-latency.py: {e}")
    if len(sys.argv) == 3:
        want = sys.argv[2].upper().removeprefix("FUSE_")
        lat = {want: lat.get(want, [])}
    print(f"{'opcode':16} {'count':>8} {'total s':>9} {'mean us':>8} {'p50 us':>8} "
          f"{'p99 us':>8} {'max ms':>8}")
    for op, ds in sorted(lat.items(), key=lambda kv: -sum(kv[1])):
        if not ds:
            print(f"{op:16} {0:8}")
            continue
        ds.sort()
        n = len(ds)
        print(f"{op:16} {n:8} {sum(ds):9.3f} {sum(ds) / n * 1e6:8.1f} "
              f"{ds[n // 2] * 1e6:8.1f} {ds[min(n - 1, n * 99 // 100)] * 1e6:8.1f} "
              f"{ds[-1] * 1e3:8.2f}")
    total = [d for ds in lat.values() for d in ds]
    print(f"{'total':16} {len(total):8} {sum(total):9.3f}")


if __name__ == "__main__":
    main()
