"""The hook's attribute keys and default names (``ATTRIBUTE_KEYS`` and ``attr`` in
deploy/condor/hydrator-classad-hook) are the daemon's ``[classad] *_attribute`` keys and
defaults (hydrator/config.py ``ClassAdConfig``): both read from their files, no daemon or pool.
"""

from __future__ import annotations

import re

import pytest

from hydrator.config import ClassAdConfig
from tests.support.hook import HOOK


def hook_names(script: str) -> tuple[list[str], dict[str, str]]:
    """The hook's ``ATTRIBUTE_KEYS`` and its table of default names, key -> name."""
    code = "\n".join(line.split("#", 1)[0] for line in script.splitlines())  # no comments
    keys = re.search(r'^ATTRIBUTE_KEYS="([^"]*)"', code, re.MULTILINE)
    table = re.search(r"^declare -A attr=\(([^)]*)\)", code, re.MULTILINE)
    assert keys is not None and table is not None, "the hook's names are no longer where read"
    return keys.group(1).split(), dict(re.findall(r"\[(\w+)\]=(\w+)", table.group(1)))


def config_names() -> dict[str, str]:
    """``ClassAdConfig``'s ``*_attribute`` keys (without the suffix) and their defaults."""
    return {
        name.removesuffix("_attribute"): field.default
        for name, field in ClassAdConfig.model_fields.items()
        if name.endswith("_attribute")
    }


def test_the_hook_has_the_daemons_attribute_keys_and_defaults() -> None:
    keys, defaults = hook_names(HOOK.read_text())
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted(config_names())
    assert defaults == config_names()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (' near"', '"'),  # a key the hook no longer knows
        ("[near]=DataLocalityNearSites", "[near]=NearSites"),  # a default that differs
    ],
)
def test_the_comparison_sees_a_hook_that_drifted(old: str, new: str) -> None:
    script = HOOK.read_text()
    assert old in script
    keys, defaults = hook_names(script.replace(old, new, 1))
    assert sorted(keys) != sorted(config_names()) or defaults != config_names()
