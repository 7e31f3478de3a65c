"""Split ``perf record`` samples into issue 27's floors, in CPU-seconds (per GiB with
``--gib``): sha256, AES-GCM (TLS records), other TLS work, user-space copies, kernel
copies, the rest of the kernel, the language runtime (Python's interpreter, Go's
runtime) and other.

Run: ``python3 -m benchmarks.perf_floors FILE.perf [--gib 1] [--freq 499] [--by
process|comm] [--top 0]``. The pods' libraries are stripped, so a sample in libcrypto or
libc without a symbol is classified by the instructions around it in the library
(``objdump`` of the copy in perf's build-id cache): ``sha256rnds2`` is sha256,
``aesenc``/``pclmulqdq`` is AES-GCM, ``rep movsb``/``vmovdqu`` in libc is a copy.
A sample counts 1/freq CPU-seconds (cpu-clock sampling). No cluster, no lock.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import re
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

CATS = ("sha256", "aes-gcm", "tls other", "user copy", "kernel copy", "kernel other",
        "runtime", "other")
WINDOW = 300  # instructions either side searched for a signature

KERNEL_COPY = re.compile(r"copy_(to|from)_iter|copy_user|rep_movs|copy_page|^memcpy|"
                         r"__memcpy|__memmove|memcpy_orig|skb_copy|csum_partial_copy|"
                         r"copy_folio|copyin|copyout|memcpy_to_page|copy_mc")
SIGS = (("sha256", re.compile(r"^sha256(rnds2|msg)")),
        ("aes-gcm", re.compile(r"^v?(aesenc|aesdec|pclmulqdq)")))


@functools.cache
def disassembly(elf: str) -> tuple[list[int], list[str]]:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", elf], capture_output=True,
                         text=True, check=True).stdout
    addrs, ops = [], []
    for line in out.splitlines():
        m = re.match(r"\s+([0-9a-f]+):\s+(\S+)(?:\s+(\S+))?", line)
        if m:
            addrs.append(int(m[1], 16))
            ops.append(m[2] if m[2] != "rep" else f"rep {m[3]}")
    return addrs, ops


@functools.cache
def by_instructions(elf: str, addr: int, lib: str) -> str:
    addrs, ops = disassembly(elf)
    i = bisect.bisect_left(addrs, addr)
    best: tuple[int, str] | None = None
    for j in range(max(0, i - WINDOW), min(len(ops), i + WINDOW)):
        for cat, sig in SIGS:
            if sig.match(ops[j]) and (best is None or abs(j - i) < best[0]):
                best = (abs(j - i), cat)
        if lib == "libc" and (ops[j] == "rep movsb" or ops[j].startswith("vmovdq")) \
                and (best is None or abs(j - i) < best[0]):
            best = (abs(j - i), "user copy")
    if best is not None:
        return best[1]
    return "tls other" if lib == "libcrypto" else "other"


@functools.cache
def go_base(elf: str) -> int | None:
    """The load address of a Go executable's text (perf reports offsets in the file),
    or None if ``elf`` is not Go (no ``.gopclntab``, which even a stripped Go binary
    keeps: ``go tool addr2line`` names its functions)."""
    out = subprocess.run(["readelf", "-SlW", elf], capture_output=True, text=True).stdout
    if ".gopclntab" not in out:
        return None
    m = re.search(r"LOAD\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)", out)
    return int(m[2], 16) - int(m[1], 16) if m else None


def go_names(elf: str, offsets: list[str]) -> dict[str, str]:
    base = go_base(elf)
    if base is None or not offsets:
        return {}
    text = "".join(f"{int(o, 16) + base:#x}\n" for o in offsets)
    out = subprocess.run(["go", "tool", "addr2line", elf], input=text, capture_output=True,
                         text=True).stdout.splitlines()
    return dict(zip(offsets, out[0::2], strict=False))


def classify(dso: str, sym: str, elf: str | None) -> str:
    s = sym.lower()
    if s.startswith("crypto/") or "/crypto/" in s:  # Go's: by package
        if "sha256" in s:
            return "sha256"
        return "aes-gcm" if "aes" in s or "gcm" in s else "tls other"
    if s.startswith("runtime.mem"):
        return "user copy"
    if dso == "[kernel.kallsyms]":
        return "kernel copy" if KERNEL_COPY.search(sym) else "kernel other"
    if "sha256" in s:
        return "sha256"
    if "gcm" in s or "ghash" in s or re.search(r"\baes", s) or "aesni" in s:
        return "aes-gcm"
    if "memmove" in s or "memcpy" in s:
        return "user copy"
    if sym.startswith("0x") and elf:
        if "libcrypto" in dso:
            return by_instructions(elf, int(sym, 16), "libcrypto")
        if dso.startswith("libc.so"):
            return by_instructions(elf, int(sym, 16), "libc")
    if "libssl" in dso or "_ssl." in dso or "crypto/tls" in s or "libcrypto" in dso:
        return "tls other"
    if re.match(r"python3|libpython", dso) or ".cpython-" in dso or s.startswith("runtime."):
        return "runtime"
    return "other"


def build_ids(perf: Path) -> dict[str, str]:
    """dso basename -> the ELF in perf's build-id cache."""
    out = subprocess.run(["perf", "buildid-list", "-i", str(perf)], capture_output=True,
                         text=True).stdout
    ids = {}
    for line in out.splitlines():
        bid, _, path = line.partition(" ")
        elf = Path.home() / ".debug" / path.lstrip("/") / bid / "elf"
        if elf.exists():
            ids[Path(path).name] = str(elf)
    return ids


def tid_pids(perf: Path) -> dict[int, int]:
    out = subprocess.run(["perf", "script", "-i", str(perf), "-F", "pid,tid", "-G"],
                         capture_output=True, text=True).stdout
    m: dict[int, int] = {}
    for line in out.splitlines():
        if (mm := re.match(r"\s*(\d+)/(\d+)", line)):
            m[int(mm[2])] = int(mm[1])
    return m


def samples(perf: Path) -> list[tuple[int, int, str, str, str]]:
    """(count, tid, comm, dso, sym) of each leaf."""
    out = subprocess.run(["perf", "report", "-i", str(perf), "-F", "sample,pid,dso,sym",
                          "--no-children", "-g", "none", "--stdio", "-q",
                          "--percent-limit", "0"], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+(\d+):(\S+)\s+(\S+)\s+\[[.k]\]\s+(.*\S)", line)
        if m:
            rows.append((int(m[1]), int(m[2]), m[3], m[4], m[5]))
    return rows


def by_syscall(perf: Path, pid: int, top: int) -> None:
    """With call graphs (``perf record -g``): ``pid``'s samples by the system call (or
    interrupt) they fell in and their leaf, to tell which kernel work a process causes."""
    out = subprocess.run(["perf", "script", "-i", str(perf), "--pid", str(pid), "-F",
                          "ip,sym"], capture_output=True, text=True).stdout
    seen: Counter[tuple[str, str]] = Counter()
    entry = re.compile(r"__(x64|do)_sys_|ksys_|asm_sysvec|asm_exc|exit_to_user_mode_loop")
    for block in out.split("\n\n"):
        frames = [[*line.split(None, 1), "?"][1] for line in block.strip().splitlines()]
        if frames:
            where = next((f for f in frames if entry.match(f)), "user")
            seen[(where.split("+")[0], frames[0].split("+")[0])] += 1
    total = sum(seen.values())
    print(f"pid {pid}: {total} samples; by entry (syscall, irq; 'user': none) > leaf")
    for (where, leaf), n in seen.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {where:34s} {leaf}")


def group_of(comm: str) -> str:
    for pat, name in (("kube-apiserver", "kube-apiserver"), ("kubelet", "kubelet"),
                      ("kubectl", "kubectl"), ("containerd-shim", "containerd-shims"),
                      ("containerd", "containerd")):
        if comm.startswith(pat[:15]):
            return name
    return comm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("perf", type=Path)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--freq", type=float, default=499.0)
    ap.add_argument("--by", choices=("all", "process", "comm"), default="all")
    ap.add_argument("--min", type=float, default=0.05, help="hide groups under this CPU-s/GiB")
    ap.add_argument("--top", type=int, default=0, help="also the top N leaves per group")
    ap.add_argument("--elf", action="append", default=[], metavar="DSO=PATH",
                    help="the ELF of DSO (a basename) where perf recorded the wrong one: "
                    "processes in a chroot (buildah run) map the host's files of that path")
    ap.add_argument("--syscalls", type=int, metavar="PID",
                    help="instead: PID's samples by system call and leaf (needs -g)")
    a = ap.parse_args()
    if a.syscalls:
        by_syscall(a.perf, a.syscalls, a.top or 20)
        return
    elfs = build_ids(a.perf) | dict(e.split("=", 1) for e in a.elf)
    pids = tid_pids(a.perf) if a.by == "process" else {}
    table: dict[str, Counter[str]] = defaultdict(Counter)
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    rows = samples(a.perf)
    unknown: dict[str, list[str]] = defaultdict(list)
    for _, _, _, dso, sym in rows:
        if sym.startswith("0x") and dso in elfs:
            unknown[dso].append(sym)
    go = {dso: go_names(elfs[dso], sorted(set(syms))) for dso, syms in unknown.items()}
    for n, tid, comm, dso, sym in rows:
        sym = go.get(dso, {}).get(sym, sym)
        key = {"all": a.perf.stem, "comm": group_of(comm),
               "process": f"{group_of(comm)}:{pids.get(tid, tid)}"}[a.by]
        cat = classify(dso, sym, elfs.get(dso))
        table[key][cat] += n
        leaves[key][f"{cat}: {dso} {sym}"] += n
    scale = 1 / a.freq / a.gib
    print(f"{'CPU-s/GiB':28s}" + "".join(f"{c:>13s}" for c in CATS) + f"{'total':>8s}")
    for key, c in sorted(table.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(c.values()) * scale
        if total < a.min:
            continue
        print(f"{key[:28]:28s}" + "".join(f"{c[k] * scale:13.2f}" for k in CATS)
              + f"{total:8.2f}")
        for leaf, n in leaves[key].most_common(a.top):
            print(f"    {n * scale:6.3f}  {leaf}")


if __name__ == "__main__":
    main()
