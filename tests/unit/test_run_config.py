import re
from pathlib import Path

import pytest

from core.records import SamplingSettings, Turns
from producer.errors import SettingsError
from producer.run_config import read_settings_file, resolve_run_settings
from workers.errors import InvalidRunName
from workers.state.keys import check_run_name
from workers.state.runs import RunSettings, decode_run_settings, differences


def test_options_override_the_file_which_overrides_the_defaults(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('output = "s3://bucket/runs"\n[sampling]\ntemperature = 0.7\nmax_tokens = 4096\n')
    settings = resolve_run_settings(
        "r1",
        pinned=None,
        file_values=read_settings_file(config),
        option_values={"max_tokens": 8192, "top_k": None},
    )
    assert settings.sampling.temperature == 0.7
    assert settings.sampling.max_tokens == 8192
    assert settings.sampling.top_k == SamplingSettings().top_k
    assert settings.output_url == "s3://bucket/runs"


def test_a_relative_output_folder_becomes_an_absolute_file_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = resolve_run_settings("r1", pinned=None, file_values={}, option_values={"output_url": "out"})
    assert settings.output_url == (tmp_path / "out").as_uri()


def test_re_running_without_options_keeps_the_pinned_settings() -> None:
    pinned = RunSettings(run="r1", sampling=SamplingSettings(max_tokens=1234), output_url="s3://b/p")
    again = resolve_run_settings("r1", pinned=pinned, file_values={}, option_values={"max_tokens": None})
    assert differences(pinned, again) == []


def test_the_difference_names_each_changed_field_with_both_values() -> None:
    pinned = RunSettings(run="r1", sampling=SamplingSettings(max_tokens=512), output_url="s3://b/p")
    given = RunSettings(run="r1", sampling=SamplingSettings(max_tokens=32768), output_url="s3://b/q")
    assert differences(pinned, given) == [
        "sampling.max_tokens: pinned 512, given 32768",
        "output_url: pinned 's3://b/p', given 's3://b/q'",
    ]


def test_an_unknown_key_in_the_file_is_refused_by_name(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("temprature = 0.7\n")
    with pytest.raises(SettingsError, match="unknown settings temprature"):
        read_settings_file(config)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (b"sampling = 3\n", "sampling must be a [sampling] table"),
        (b"gate = 'strict'\n", "gate must be a [gate] table"),
        (b"\xff\xfe max_tokens = 1\n", "cannot read settings file"),
    ],
    ids=["sampling not a table", "gate not a table", "not UTF-8"],
)
def test_a_settings_file_of_the_wrong_shape_is_refused_naming_it(
    tmp_path: Path, text: bytes, words: str
) -> None:
    config = tmp_path / "run.toml"
    config.write_bytes(text)
    with pytest.raises(SettingsError, match=re.escape(words)):
        read_settings_file(config)


def test_a_wrong_type_is_refused() -> None:
    with pytest.raises(SettingsError, match="invalid run settings"):
        resolve_run_settings("r1", pinned=None, file_values={"max_tokens": "many"}, option_values={})


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("run\n", "must start with a letter or digit"),
        ("x" * 500, "500 characters long; at most 128"),
        ("../etc", "must start with a letter or digit"),
        ("workers", "reserved"),
    ],
)
def test_a_run_name_that_is_not_a_safe_key_and_path_segment_is_refused_saying_why(
    name: str, words: str
) -> None:
    with pytest.raises(InvalidRunName, match=re.escape(words)):
        check_run_name(name)


def test_a_new_run_regenerates_every_turn_and_a_settings_file_can_say_last(tmp_path: Path) -> None:
    assert resolve_run_settings("r1", pinned=None, file_values={}, option_values={}).turns is Turns.ALL
    config = tmp_path / "run.toml"
    config.write_text('turns = "last"\n')
    from_file = resolve_run_settings(
        "r1", pinned=None, file_values=read_settings_file(config), option_values={}
    )
    assert from_file.turns is Turns.LAST


def test_a_run_pinned_before_turns_existed_keeps_answering_the_last_turn_only() -> None:
    pinned = decode_run_settings(b'{"run":"old","sampling":{},"output_url":"s3://b/p"}')
    again = resolve_run_settings("old", pinned=pinned, file_values={}, option_values={"turns": None})
    assert again.turns is Turns.LAST
    changed = resolve_run_settings("old", pinned=pinned, file_values={}, option_values={"turns": "all"})
    assert differences(pinned, changed) == ["turns: pinned 'last', given 'all'"]


def test_an_unknown_turns_value_is_refused() -> None:
    with pytest.raises(SettingsError, match="turns"):
        resolve_run_settings("r1", pinned=None, file_values={"turns": "some"}, option_values={})
