"""Figures the reliability tests measure, appended as JSON lines to ``$DFLASH_FIGURES`` when set
(``scripts/reliability.sh`` collects them into its table)."""

from __future__ import annotations

import json
import os


def record_figure(name: str, **values) -> None:
    path = os.environ.get("DFLASH_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"figure": name, **values}) + "\n")
