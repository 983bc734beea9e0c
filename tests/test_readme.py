"""What the README tells a newcomer about the tests: every variable the suite reads from the environment named, and
the fast selection offered before the whole suite, whose time is said (issue 42, item 9)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = re.compile(r'^python3 -m pip install "\.\[test\]" && python3 -m pytest -m "not slow and not cluster and not '
                  r'subprocess"', re.M)
#: the whole suite's command (README's second set-up command, .ci/run's), and what its line says after it
WHOLE = re.compile(r'^python3 -m pip install "\.\[test\]" && python3 -m pytest(?:\s+#(.*))?$', re.M)


def _variables_the_tests_read() -> set[str]:
    # os.environ.get("DASKNN_..."), os.environ["DASKNN_..."] and os.getenv("DASKNN_...") anywhere under tests/
    read = re.compile(r"""(?:environ\.get\(|environ\[|getenv\()\s*["'](DASKNN_[A-Z0-9_]+)["']""")
    return {name for path in (ROOT / "tests").rglob("*.py") for name in read.findall(path.read_text())}


def test_the_readme_names_every_variable_the_tests_read():
    found = _variables_the_tests_read()
    assert "DASKNN_GRAPHCHALLENGE_DIR" in found  # (the scan sees the real-data tests' folder)
    readme = (ROOT / "README.md").read_text()
    assert not sorted(v for v in found if f"`{v}" not in readme), "not named in the README"


def test_the_readme_offers_the_fast_selection_before_the_whole_suite_and_says_how_long_that_takes():
    readme = (ROOT / "README.md").read_text()
    fast, whole = FAST.search(readme), WHOLE.search(readme)
    assert fast and whole, "the fast selection's or the whole suite's command is missing"
    assert fast.start() < whole.start()
    assert re.search(r"about \d+ minutes", whole.group(1) or ""), whole.group(0)
