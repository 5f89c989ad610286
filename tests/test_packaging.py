"""A non-editable install (a wheel, as the GPU machine's payload builds) ships exactly the packages setup.cfg lists:
every package of the source tree must be there."""

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_of_sfengine_is_listed_for_installation():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    listed = set(setup["options"]["packages"].split())
    found = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "sfengine").rglob("__init__.py")}
    assert found - listed == set(), f"add to setup.cfg [options] packages: {sorted(found - listed)}"
