"""docs/support-matrix.md: its rows, read and written in one place.

hack/test-matrix.sh writes the page from the cells' JUnit reports
(``python3 -m tests.framework.supportmatrix OUT REPORTS TESTS CONTAINERD_VERSION CELL...``);
tests/manifests/test_kube_versions.py reads the same rows. Rows of combinations not run
this time are kept from the page (each row names what it ran), so the matrix can be
filled one cell at a time; notes below the marker are kept.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

MARKER = "<!-- notes: kept by hack/test-matrix.sh -->"
COLUMNS = ("kube", "containerd", "tests", "passed", "failed", "skipped", "seconds", "failures")


def _cols(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def row_lines(page: str) -> dict[tuple[str, str], str]:
    """The table's lines by (Kubernetes release, containerd), from the page's text."""
    rows: dict[tuple[str, str], str] = {}
    for line in page.partition(MARKER)[0].splitlines():
        cols = _cols(line)
        if line.startswith("| v") and len(cols) >= 2:
            rows[(cols[0], cols[1])] = line
    return rows


def rows(page: str) -> list[dict[str, str]]:
    """The table's rows as column name -> text."""
    return [dict(zip(COLUMNS, _cols(line), strict=True)) for line in row_lines(page).values()]


def cell_row(reports: Path, cell: str, tests: str) -> tuple[tuple[str, str], str]:
    kube, ctrd = cell.removeprefix("kube-").split(".containerd-")
    xml = reports / f"{cell}.xml"
    secs = (reports / f"{cell}.seconds").read_text().strip()
    if not xml.exists():
        return (kube, ctrd), (f"| {kube} | {ctrd} | `{tests}` | - | - | - | {secs} | "
                              f"no report: see {reports}/{cell}.log |")
    suite = ET.parse(xml).getroot()
    found = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert found is not None, xml
    n = {k: int(found.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    secs = str(round(float(found.get("time") or secs)))  # pytest's own: no lock wait
    failed = n["failures"] + n["errors"]
    passed = n["tests"] - failed - n["skipped"]
    names = [f"{c.get('classname', '').rsplit('.', 1)[-1]}::{c.get('name')}"
             for c in found.iter("testcase")
             if c.find("failure") is not None or c.find("error") is not None]
    return (kube, ctrd), (f"| {kube} | {ctrd} | `{tests}` | {passed} | {failed} | "
                          f"{n['skipped']} | {secs} | {', '.join(names)} |")


def order(key: tuple[str, str]) -> tuple[list[int], str]:
    return [int(x) for x in key[0].lstrip("v").split(".")], key[1]


def write(out: Path, reports: Path, tests: str, ctd2: str, cells: list[str]) -> str:
    old = out.read_text() if out.exists() else ""
    table = row_lines(old)
    for cell in cells:
        key, line = cell_row(reports, cell, tests)
        table[key] = line
    ctd_names = {"1.6": "Debian's containerd 1.6", "2.x": f"containerd {ctd2} (transfer pull)"}
    text = f"""# Support matrix

Written by `hack/test-matrix.sh` (do not edit the table by hand). Each row is one pytest
session of the tests it names against a real control plane and node built at that
Kubernetes release, with the node's containerd as named
({'; '.join(f'{k}: {v}' for k, v in ctd_names.items())}).

| Kubernetes | containerd | tests | passed | failed | skipped | seconds | failures |
|---|---|---|---|---|---|---|---|
""" + "\n".join(table[k] for k in sorted(table, key=order)) + "\n"
    if MARKER in old:
        text += "\n" + MARKER + old.partition(MARKER)[2]
    out.write_text(text)
    return text


if __name__ == "__main__":
    print(write(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]))
