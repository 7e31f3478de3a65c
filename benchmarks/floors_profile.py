"""``bench_kubectl_cp`` with a system-wide ``perf record -a -g`` around every transfer,
both tools' (issue 27's floors: kube-apiserver, kubelet, containerd, the shims, tar and
the kernel have no Python to py-spy, and ``kubectl cp``'s transfers are not profiled by
the bench itself).

Run: ``python3 -m benchmarks.floors_profile DIR [bench_kubectl_cp arguments...]``. Each
transfer leaves ``DIR/<scenario>-<tool>_<way>-system.perf`` beside the bench's own
per-process profiles (``--py-spy DIR``); read them with ``perf report -i FILE --sort
comm,dso,sym`` or ``python3 -m benchmarks.perf_floors``. Under the heavy lock, like the
bench.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from benchmarks import _kcpbench, bench_kubectl_cp


def with_system_perf(out: Path, inner: object) -> object:
    @contextlib.contextmanager
    def profiled(spy: Path | None, key: str, pids: Mapping[str, int | None],
                 **kw: bool) -> Iterator[None]:
        path = out / f"{key.replace(' ', '_')}-system.perf"
        rec = subprocess.Popen(["perf", "record", "-q", "-a", "-g", "-F", "499", "-o",
                                str(path)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            with inner(spy, key, pids, **kw):  # type: ignore[operator]
                yield
        finally:
            rec.send_signal(signal.SIGINT)
            rec.wait()
    return profiled


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    _kcpbench.profiled = with_system_perf(out, _kcpbench.profiled)  # type: ignore[assignment]
    return bench_kubectl_cp.main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
