"""The docs say what issue 14 asked them to say, and stay runnable: the KEP's goals
name the plugins, its PRR scalability answers quote benchmark figures with commands
that still parse, and the README has the install, support-matrix, troubleshooting and
plugin-completion sections."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.framework.repo import REPO

KEP = (REPO / "docs/kep-aggapi.md").read_text()
README = (REPO / "README.md").read_text()
# python3 -m benchmarks.NAME [--flag value ...], possibly wrapped over lines in a span.
COMMAND = re.compile(r"`python3 -m benchmarks\.(\w+)((?:\s+--[\w-]+(?:\s+[\w.]+)?)*)`")


def section(text: str, title: str) -> str:
    """The body under the heading ``title``, up to the next heading of its level or
    above."""
    m = re.search(rf"^(#+) {re.escape(title)}$", text, re.M)
    assert m is not None, f"no section {title!r}"
    level = len(m.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, m.end())
    return text[m.end():end.start() if end else len(text)]


def test_goals_and_non_goals_match_the_code() -> None:
    goals, non_goals = section(KEP, "Goals"), section(KEP, "Non-Goals")
    assert "kubectl image-pull-progress" in goals and "kubectl ncp" in goals
    assert "plugin" not in non_goals.lower()
    # CRI-O is supported (degraded), not a non-goal as a runtime.
    assert "degraded" in non_goals and not re.search(r"^- CRI-O", non_goals, re.M)


def scalability_answers() -> list[str]:
    text = section(KEP, "Scalability")
    return [b for b in re.split(r"\n(?=- )", text) if b.startswith("- ")]


def test_scalability_answers_quote_figures_with_their_commands() -> None:
    text = section(KEP, "Scalability")
    assert re.search(r"measured on \d{4}-\d\d-\d\d on a 2-core", " ".join(text.split()))
    answers = scalability_answers()
    assert len(answers) >= 5
    quoted = 0
    for a in answers:
        flat = " ".join(a.split())
        if COMMAND.search(flat):
            quoted += 1
            assert re.search(r"\d+\.\d", flat), a  # a figure, not only a command
        else:  # no figure to back: must be a plain "No"
            assert re.search(r"\* No[:,]", flat), a
    assert quoted >= 4


def test_quoted_benchmark_commands_still_parse() -> None:
    commands = [c for a in scalability_answers() for c in COMMAND.findall(" ".join(a.split()))]
    assert {name for name, _ in commands} >= {"bench_authz", "bench_agent_progress",
                                              "bench_progress", "bench_tarparse"}
    for name, flags in commands:
        assert (REPO / "benchmarks" / f"{name}.py").exists(), name
        r = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
        assert r.returncode == 0, (name, r.stderr)
        for flag in re.findall(r"--[\w-]+", flags):
            assert re.search(rf"{flag}\b", r.stdout), (name, flag)


def test_readme_sections() -> None:
    for title in ("On a real cluster", "What has been tested", "Troubleshooting",
                  "Install the plugins", "The kubectl plugins"):
        assert section(README, title).strip(), title
    assert "kind load" in section(README, "On a real cluster")
    tested = section(README, "What has been tested")
    assert all(w in tested for w in ("kubelet", "containerd", "kernel"))
    plugins = section(README, "Install the plugins")
    assert "kubectl_complete-ncp" in plugins and "kubectl_complete-image_pull_progress" \
        in plugins and "PATH" in plugins
