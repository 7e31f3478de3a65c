"""benchmarks/perf_floors.py's classification of perf samples into issue 27's floors:
symbol names (kernel, Go, named libc) and, for stripped libraries, the instructions
around an address, read back with objdump from an object assembled here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.perf_floors import by_instructions, classify

# Three regions far apart (more than perf_floors.WINDOW instructions of padding): a
# sha256 loop, an AES-GCM loop, a copy; and code with none of their instructions.
PAD = "    nop\n" * 700
ASM = f"""
    .text
sha:
    sha256rnds2 %xmm0, %xmm1, %xmm2
    paddd %xmm7, %xmm6
{PAD}
gcm:
    aesenc %xmm1, %xmm2
    pclmulqdq $0, %xmm3, %xmm4
{PAD}
copy:
    rep movsb
    ret
{PAD}
plain:
    add %rax, %rbx
    ret
"""


@pytest.fixture(scope="module")
def obj(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, int]]:
    if shutil.which("as") is None or shutil.which("objdump") is None:
        pytest.skip("binutils (as, objdump) not installed")
    d = tmp_path_factory.mktemp("perf-floors")
    (d / "t.s").write_text(ASM)
    subprocess.run(["as", "-o", str(d / "t.o"), str(d / "t.s")], check=True)
    syms = subprocess.run(["nm", str(d / "t.o")], capture_output=True, text=True,
                          check=True).stdout
    addrs = {name: int(addr, 16) for addr, _, name in
             (line.split() for line in syms.splitlines())}
    return str(d / "t.o"), addrs


def test_stripped_library_regions_by_their_instructions(
        obj: tuple[str, dict[str, int]]) -> None:
    elf, at = obj
    # An address a few bytes into each region (a sample rarely hits the first one).
    assert by_instructions(elf, at["sha"] + 4, "libcrypto") == "sha256"
    assert by_instructions(elf, at["gcm"] + 4, "libcrypto") == "aes-gcm"
    assert by_instructions(elf, at["plain"], "libcrypto") == "tls other"
    assert by_instructions(elf, at["copy"], "libc") == "user copy"
    assert by_instructions(elf, at["plain"], "libc") == "other"


@pytest.mark.parametrize(("dso", "sym", "cat"), [
    ("[kernel.kallsyms]", "_copy_to_iter", "kernel copy"),
    ("[kernel.kallsyms]", "copy_folio_from_iter_atomic", "kernel copy"),
    ("[kernel.kallsyms]", "tcp_sendmsg_locked", "kernel other"),
    ("kube-apiserver-v1.37.2", "crypto/internal/fips140/aes/gcm.gcmAesDec", "aes-gcm"),
    ("kubelet-v1.37.2", "crypto/internal/fips140/sha256.blockSHANI", "sha256"),
    ("kubelet-v1.37.2", "crypto/tls.(*Conn).Read", "tls other"),
    ("kubelet-v1.37.2", "runtime.memmove", "user copy"),
    ("kubelet-v1.37.2", "runtime.scanObject", "runtime"),
    ("kubelet-v1.37.2", "golang.org/x/net/websocket.(*hybiFrameReader).Read", "other"),
    ("libc.so.6", "__memmove_avx512_unaligned_erms", "user copy"),
    ("libcrypto.so.3", "EVP_DigestUpdate", "tls other"),
    ("libssl.so.3", "ssl3_read_bytes", "tls other"),
    ("python3.13", "_PyEval_EvalFrameDefault", "runtime"),
    ("libpython3.11.so.1.0", "gc_collect_main", "runtime"),
    ("loop.cpython-313-x86_64-linux-gnu.so", "__pyx_f_uvloop", "runtime"),
])
def test_named_symbols(dso: str, sym: str, cat: str) -> None:
    assert classify(dso, sym, None) == cat


def test_unnamed_address_without_its_library_is_other() -> None:
    assert classify("libc.so.6", "0x000000000017bdb2", None) == "other"
    assert classify("libcrypto.so.3", "0x00000000003a1d1a", None) == "tls other"


def test_script_runs_on_a_real_recording(tmp_path: Path) -> None:
    """End to end on a perf recording of a tiny command, when perf may record here."""
    if shutil.which("perf") is None:
        pytest.skip("perf not installed")
    data = tmp_path / "t.perf"
    rec = subprocess.run(["perf", "record", "-q", "-F", "999", "-o", str(data), "--",
                          "python3", "-c", "import hashlib; hashlib.sha256(b'x' * (64 << 20))"],
                         capture_output=True, text=True)
    if rec.returncode != 0:
        pytest.skip(f"perf record not allowed here: {rec.stderr.strip()[-200:]}")
    out = subprocess.run(["python3", "-m", "benchmarks.perf_floors", str(data), "--min", "0"],
                         capture_output=True, text=True, check=True).stdout
    head, row = out.splitlines()[:2]
    assert head.split()[1:3] == ["sha256", "aes-gcm"]
    values = [float(v) for v in row.split()[1:]]
    assert values[0] > 0  # the sha256 of 64 MiB shows as sha256 (host libcrypto, unnamed)
    assert values[-1] == pytest.approx(sum(values[:-1]), abs=0.02)
