"""Which kernels Numba spent its compile time on, from its compile events.

    python tools/compile_report.py [--top N] [--json FILE] (-c CODE | SCRIPT [ARGS...])

Runs the code (or script) in this process with a listener on Numba's
``numba:compile`` events and prints the top signatures by compile seconds:
total (including the functions compiled inside it) and self (without them).
Only actual compilations are events: a kernel loaded from the disk cache
costs none, so run it with a fresh ``NUMBA_CACHE_DIR`` for cold figures.
"""

import argparse
import collections
import json
import runpy
import sys
import time

from numba.core import event


class _CompileTimes(event.Listener):
    def __init__(self):
        self.stack = []  # [start, children's seconds]
        self.total = collections.Counter()
        self.self_ = collections.Counter()
        self.count = collections.Counter()

    @staticmethod
    def _key(ev):
        disp, args = ev.data["dispatcher"], ev.data["args"]
        fn = disp.py_func
        return f"{fn.__module__}.{fn.__qualname__}{tuple(str(a) for a in args)}"

    def on_start(self, ev):
        self.stack.append([time.perf_counter(), 0.0])

    def on_end(self, ev):
        start, children = self.stack.pop()
        dur = time.perf_counter() - start
        if self.stack:
            self.stack[-1][1] += dur
        key = self._key(ev)
        self.total[key] += dur
        self.self_[key] += dur - children
        self.count[key] += 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--json", help="also write every signature's seconds here")
    ap.add_argument("-c", dest="code")
    ap.add_argument("script", nargs="?")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    opts = ap.parse_args(argv)
    if (opts.code is None) == (opts.script is None):
        ap.error("give -c CODE or a SCRIPT")
    listener = _CompileTimes()
    with event.install_listener("numba:compile", listener):
        if opts.code is not None:
            exec(compile(opts.code, "<compile-report>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [opts.script] + opts.args
            runpy.run_path(opts.script, run_name="__main__")
    rows = sorted(listener.self_.items(), key=lambda kv: -kv[1])
    print(f"{len(rows)} signatures compiled, {sum(listener.self_.values()):.1f} s in all")
    print(f"{'self s':>8} {'total s':>8}  kernel(signature)")
    for key, s in rows[:opts.top]:
        print(f"{s:8.2f} {listener.total[key]:8.2f}  {key}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({k: {"self_s": s, "total_s": listener.total[k],
                           "compilations": listener.count[k]} for k, s in rows}, f, indent=1)


if __name__ == "__main__":
    main()
