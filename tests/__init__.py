"""paxlite's tests: they mirror the source tree (tests/paxlite/formats/hf/test_models.py tests
paxlite/formats/hf/models.py); end-to-end runs, named by behaviour, are in tests/e2e/."""

import pathlib

#: The repository root, and the fixtures every test reads from (whatever its depth).
REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
