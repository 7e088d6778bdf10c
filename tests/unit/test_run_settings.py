"""A run's settings from their one home: the file, the options over it, the pinned copy or the defaults."""

import argparse
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from core.errors import SettingsRefused
from core.records import SamplingSettings, Turns
from core.run_settings.keys import KEYS, settings_problems
from core.run_settings.layers import read_toml, resolve, stated_settings
from core.run_settings.model import RunSettings, differences, new_run_settings
from core.run_settings.options import stated_options
from workers.errors import InvalidRunName, RecordUnreadable
from workers.state.keys import check_run_name
from workers.state.runs import decode_run_settings, encode_run_settings

NEW_RUN_OUTPUT = "s3://bucket/default"


def resolve_run_settings(
    run: str,
    *,
    pinned: RunSettings | None,
    file_values: dict[str, Any],
    option_values: dict[str, Any],
) -> RunSettings:
    stated = stated_settings(file_values, option_values)
    return resolve(run, pinned=pinned, stated=stated, new_run_output=NEW_RUN_OUTPUT)


def test_options_override_the_file_which_overrides_the_defaults(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('output = "s3://bucket/runs"\n[sampling]\ntemperature = 0.7\nmax_tokens = 4096\n')
    settings = resolve_run_settings(
        "r1",
        pinned=None,
        file_values=read_toml(config),
        option_values={"max_tokens": 8192, "top_k": None},
    )
    assert settings.sampling.temperature == 0.7
    assert settings.sampling.max_tokens == 8192
    assert settings.sampling.top_k == SamplingSettings().top_k
    assert settings.output == "s3://bucket/runs"


def test_a_new_run_stated_nothing_takes_the_defaults_and_the_given_output() -> None:
    settings = resolve_run_settings("r1", pinned=None, file_values={}, option_values={})
    assert settings == new_run_settings("r1", NEW_RUN_OUTPUT)
    assert settings_problems(settings) == []


def test_re_running_without_options_keeps_the_pinned_settings() -> None:
    pinned = RunSettings(run="r1", sampling=SamplingSettings(max_tokens=1234), output="s3://b/p")
    again = resolve_run_settings("r1", pinned=pinned, file_values={}, option_values={"max_tokens": None})
    assert differences(pinned, again) == []


def test_the_difference_names_each_changed_field_with_both_values() -> None:
    pinned = RunSettings(run="r1", sampling=SamplingSettings(max_tokens=512), output="s3://b/p")
    given = RunSettings(run="r1", sampling=SamplingSettings(max_tokens=32768), output="s3://b/q")
    assert differences(pinned, given) == [
        "sampling.max_tokens: pinned 512, given 32768",
        "output: pinned 's3://b/p', given 's3://b/q'",
    ]


def test_an_unknown_key_in_the_file_is_refused_by_name(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("temprature = 0.7\n")
    with pytest.raises(SettingsRefused, match="unknown settings temprature"):
        read_toml(config)


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
    with pytest.raises(SettingsRefused, match=re.escape(words)):
        read_toml(config)


def test_a_wrong_type_is_refused() -> None:
    with pytest.raises(SettingsRefused, match="invalid run settings"):
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
    from_file = resolve_run_settings("r1", pinned=None, file_values=read_toml(config), option_values={})
    assert from_file.turns is Turns.LAST


def test_a_run_pinned_before_turns_existed_keeps_answering_the_last_turn_only() -> None:
    pinned = decode_run_settings(b'{"run":"old","sampling":{},"output_url":"s3://b/p"}')
    again = resolve_run_settings("old", pinned=pinned, file_values={}, option_values={"turns": None})
    assert again.turns is Turns.LAST
    assert again.output == "s3://b/p"  # pinned when the output was stored as output_url
    changed = resolve_run_settings("old", pinned=pinned, file_values={}, option_values={"turns": "all"})
    assert differences(pinned, changed) == ["turns: pinned 'last', given 'all'"]


def test_an_unknown_turns_value_is_refused() -> None:
    with pytest.raises(SettingsRefused, match="turns"):
        resolve_run_settings("r1", pinned=None, file_values={"turns": "some"}, option_values={})


@pytest.mark.parametrize(
    ("file_values", "option_values", "words"),
    [
        ({}, {"top_p": 2.0}, "--top-p 2.0: must be above 0 and at most 1"),
        ({"temperature": float("nan")}, {}, "run.toml: temperature = nan: must be a finite number"),
        (
            {"gate_max_empty_answer_rate": 1.5},
            {},
            "run.toml: gate_max_empty_answer_rate = 1.5: must be a share",
        ),
        ({}, {"batch_size": 0}, "--batch-size 0: must be between 1 and 4096 prompts per message"),
        (
            {"max_tokens": 10},
            {"max_tokens": "ten"},
            "--max-tokens 'ten': invalid run settings: Expected `int`",
        ),
        ({}, {"id_field": " "}, "--id-field ' ': must be a column name"),
    ],
)
def test_a_stated_value_no_run_can_use_is_refused_naming_where_it_was_stated(
    file_values: dict[str, Any], option_values: dict[str, Any], words: str
) -> None:
    with pytest.raises(SettingsRefused, match=re.escape(words)):
        stated_settings(file_values, option_values, file_label="run.toml")


def test_a_retry_cap_not_above_the_budget_is_refused_naming_the_option() -> None:
    with pytest.raises(
        SettingsRefused, match=re.escape("--retry-max-tokens-cap 4096: must be above max_tokens")
    ):
        resolve_run_settings(
            "r1",
            pinned=None,
            file_values={"max_tokens": 8192},
            option_values={"truncated_thinking": "retry", "retry_max_tokens_cap": 4096},
        )


def test_a_pinned_copy_holding_a_value_no_run_can_use_is_refused_as_it_is_read_back() -> None:
    good = msgspec.json.decode(encode_run_settings(new_run_settings("r1", NEW_RUN_OUTPUT)))
    good["sampling"]["top_p"] = 7.0
    with pytest.raises(RecordUnreadable, match=re.escape("top_p 7.0: must be above 0 and at most 1")):
        decode_run_settings(msgspec.json.encode(good))


def _leaf_paths(struct: type[msgspec.Struct], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for field in msgspec.structs.fields(struct):
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            paths |= _leaf_paths(field.type, (*prefix, field.name))
        else:
            paths.add((*prefix, field.name))
    return paths


PINNED_NOT_STATED = {("run",), ("column_types",)}  # the name it is called by; types read from its rows


def test_every_setting_a_run_pins_has_one_key_and_every_key_one_place_in_the_settings() -> None:
    assert {key.path for key in KEYS.values()} == _leaf_paths(RunSettings) - PINNED_NOT_STATED


def _enqueue_parser() -> argparse.ArgumentParser:
    from producer.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            enqueue: argparse.ArgumentParser = action.choices["enqueue"]
            return enqueue
    raise AssertionError("producer has no enqueue command")


def test_every_key_is_an_option_of_enqueue_that_stores_under_its_name() -> None:
    parser = _enqueue_parser()
    unstated = vars(parser.parse_args(["data.jsonl", "--run", "r1"]))
    assert {name for name in KEYS if name in unstated and unstated[name] is None} == set(KEYS)
    dest_of = {option: action.dest for action in parser._actions for option in action.option_strings}
    assert {key.flag: dest_of.get(key.flag) for key in KEYS.values()} == {
        key.flag: key.name for key in KEYS.values()
    }


def test_the_output_has_one_name_as_an_option_a_toml_key_and_a_field(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('output = "s3://bucket/from-file"\n')
    from_file = resolve_run_settings("r1", pinned=None, file_values=read_toml(config), option_values={})
    assert from_file.output == "s3://bucket/from-file"
    assert KEYS["output"].flag == "--output"
    assert b'"output":"s3://bucket/from-file"' in encode_run_settings(from_file)


def test_a_chat_shape_of_its_own_is_stated_as_options_or_in_the_toml_and_pinned_alike(tmp_path: Path) -> None:
    parser = _enqueue_parser()
    args = parser.parse_args(
        ["data.jsonl", "--run", "r1", "--turn-keys", "speaker,text", "--roles", "human=user,bot=assistant"]
    )
    from_options = resolve_run_settings("r1", pinned=None, file_values={}, option_values=stated_options(args))
    config = tmp_path / "run.toml"
    config.write_text('turn_keys = ["speaker", "text"]\n[roles]\nhuman = "user"\nbot = "assistant"\n')
    from_file = resolve_run_settings("r1", pinned=None, file_values=read_toml(config), option_values={})
    assert from_options == from_file
    assert from_file.turn_keys == ("speaker", "text")
    assert from_file.roles == {"human": "user", "bot": "assistant"}
    assert decode_run_settings(encode_run_settings(from_file)) == from_file


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"turn_keys": ["text", "text"]}, "--turn-keys ['text', 'text']: must name two different keys"),
        (
            {"turn_keys": ["speaker"]},
            "--turn-keys ['speaker']: invalid run settings: Expected `array` of length 2",
        ),
        (
            {"roles": {"bot": "robot"}},
            "--roles {'bot': 'robot'}: bot=robot: a role name stands for one of system",
        ),
        ({"roles": {}}, "--roles {}: must map at least one role name"),
    ],
)
def test_a_chat_shape_that_cannot_be_read_is_refused_naming_the_option(
    options: dict[str, Any], words: str
) -> None:
    with pytest.raises(SettingsRefused, match=re.escape(words)):
        stated_settings({}, options)


@pytest.mark.parametrize(
    ("argv", "words"),
    [(["--turn-keys", "speaker"], "must be ROLE_KEY,TEXT_KEY"), (["--roles", "bot"], "must be NAME=ROLE")],
)
def test_a_chat_shape_option_of_the_wrong_form_is_a_usage_error(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _enqueue_parser().parse_args(["data.jsonl", "--run", "r1", *argv])
    assert words in capsys.readouterr().err
