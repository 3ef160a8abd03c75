"""docs/config.md is what scripts/gen_config_docs.py makes of the config models today."""

import runpy
import typing

from conftest import ROOT

GEN = runpy.run_path(str(ROOT / "scripts" / "gen_config_docs.py"))


def test_config_docs_are_current():
    assert (ROOT / "docs" / "config.md").read_text() == GEN["render"](), (
        "docs/config.md is stale: run python scripts/gen_config_docs.py"
    )


def test_every_key_is_documented_with_its_default():
    from pydantic import BaseModel

    from train.front.config import TrainConfig

    text = GEN["render"]()

    def keys(model, prefix=""):
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                yield from keys(field.annotation, f"{prefix}{name}.")
                continue
            yield f"{prefix}{name}", field
            optional = [a for a in typing.get_args(field.annotation) if a is not type(None)]
            if len(optional) == 1 and isinstance(optional[0], type) and issubclass(optional[0], BaseModel):
                yield from keys(optional[0], f"{prefix}{name}.")  # a section that may be null

    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines() if line.startswith("| `")}
    expected = dict(keys(TrainConfig))
    assert set(rows) == set(expected)
    assert "| `optim.lr` | float | `0.0003` | > 0 |" in rows["optim.lr"]
    assert "**required**" in rows["steps"] and "`[]`" in rows["log.tracker"]
