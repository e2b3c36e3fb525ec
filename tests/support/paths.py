"""Where the checkout and the test fixtures are, for tests at any depth."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
LOGS = FIXTURES / "logs"
