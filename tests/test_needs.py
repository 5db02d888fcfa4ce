"""``tests.needs.missing``: a missing browser or model skips a test here and fails it under CI."""

import pytest

from tests.needs import missing


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("1", pytest.fail.Exception),
                                         ("", pytest.skip.Exception), ("false", pytest.skip.Exception)])
def test_a_missing_requirement_fails_under_ci_and_skips_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="no Chromium"):
        missing("no Chromium at /usr/bin/chromium")
