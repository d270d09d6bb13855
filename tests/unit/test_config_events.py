"""``[sources.events]`` of a Rucio source: off by default, checked, paths resolved and files
checked like the source's own (hydrator.config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydrator.config import RucioSourceConfig, load_config
from hydrator.errors import ConfigError

BASE = """\
[daemon]
state_path = "state.sqlite"

[[sources]]
type = "rucio"
rucio_host = "https://rucio.example.org"

[sources.events]
"""


def load(tmp_path: Path, events: str) -> RucioSourceConfig:
    path = tmp_path / "hydrator.toml"
    path.write_text(BASE + events)
    source = load_config(path).sources[0]
    assert isinstance(source, RucioSourceConfig)
    return source


def test_events_are_off_by_default(tmp_path: Path) -> None:
    events = load(tmp_path, "").events
    assert not events.enabled
    assert events.event_debounce_s == 1.0
    assert events.reconcile_interval_s == 1800.0


def test_a_relative_password_file_is_resolved_and_must_exist(tmp_path: Path) -> None:
    (tmp_path / "mq-password").write_text("secret\n")
    events = load(
        tmp_path,
        'enabled = true\nbrokers = ["mq:61613"]\nusername = "h"\npassword_file = "mq-password"\n',
    ).events
    assert events.password_file == tmp_path / "mq-password"
    with pytest.raises(ConfigError, match=r"sources\[0\]\.events\.password_file"):
        load(
            tmp_path,
            'enabled = true\nbrokers = ["mq:61613"]\nusername = "h"\npassword_file = "nope"\n',
        )


@pytest.mark.parametrize(
    ("events", "key"),
    [
        ("enabled = true\n", "events"),  # no broker
        ('brokers = ["mq"]\n', "brokers"),  # no port
        ('brokers = ["mq:99999"]\n', "brokers"),
        ('username = "h"\n', "events"),  # a user without a password file
        ("event_debounce_s = -1\n", "event_debounce_s"),
        ("max_event_reads_per_cycle = 0\n", "max_event_reads_per_cycle"),
        ('client_id = "a b"\n', "client_id"),
        ('destination = "rucio.events"\n', "destination"),
        ('destination = "/topic/a\\nb"\n', "destination"),
        ("unknown = 1\n", "unknown"),
    ],
)
def test_bad_events_settings_name_the_key(tmp_path: Path, events: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load(tmp_path, events)


TWO = """\
[daemon]
state_path = "state.sqlite"

[[sources]]
type = "rucio"
name = "rucio-a"
rucio_host = "https://a.example.org"

[sources.events]
enabled = true
brokers = ["mq:61613"]
{first}
[[sources]]
type = "rucio"
name = "rucio-b"
rucio_host = "https://b.example.org"

[sources.events]
enabled = true
brokers = ["mq:61613"]
"""


def test_two_sources_at_one_broker_need_two_client_ids(tmp_path: Path) -> None:
    path = tmp_path / "hydrator.toml"
    path.write_text(TWO.format(first=""))  # both the default "hydrator"
    with pytest.raises(ConfigError, match=r"sources\[1\]\.events\.client_id") as raised:
        load_config(path)
    assert len(str(raised.value).splitlines()) == 1
    path.write_text(TWO.format(first='client_id = "hydrator-a"\n'))
    assert len(load_config(path).sources) == 2
