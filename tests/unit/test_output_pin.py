"""The uploader writes a run's parts only to an output whose run.json names that run and that output."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from workers.errors import OutputTaken
from workers.record.manifest import SETTINGS_KEY
from workers.record.object_store import ObjectStore
from workers.record.output_pin import (
    OutputPin,
    output_pin_mismatch,
    overlapping_run_output,
    read_run_json,
    run_json_of,
)
from workers.record.output_pin import write_run_json as write_run_to
from workers.record.storage import open_store
from workers.state.control import PAUSED_BY_OUTPUT_PIN, pause_state
from workers.state.keys import RunKeys
from workers.state.runs import encode_run_settings

RUN = "pinned-run"


class DictRedis:
    """The two string commands pausing uses, over a dict."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def setnx(self, key: str, value: bytes) -> bool:
        if key in self.values:
            return False
        self.values[key] = value
        return True

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)


def folder(tmp_path: Path, name: str) -> ObjectStore:
    return open_store((tmp_path / name).as_uri())


def write_run_json(store: ObjectStore, *, run: str = RUN, output: str | None = None) -> None:
    settings = RunSettings(run=run, sampling=SamplingSettings(), output=output or store.url)
    store.put(SETTINGS_KEY, encode_run_settings(settings))


def test_an_output_whose_run_json_names_the_run_and_itself_is_confirmed(tmp_path: Path) -> None:
    store = folder(tmp_path, "out")
    write_run_json(store)
    assert output_pin_mismatch(RUN, store) is None


def test_an_output_without_run_json_is_refused(tmp_path: Path) -> None:
    reason = output_pin_mismatch(RUN, folder(tmp_path, "elsewhere"))
    assert reason is not None and "holds no run.json" in reason


def test_an_output_whose_run_json_names_another_run_is_refused(tmp_path: Path) -> None:
    store = folder(tmp_path, "out")
    write_run_json(store, run="another-run")
    reason = output_pin_mismatch(RUN, store)
    assert reason is not None and "holds the output of run 'another-run'" in reason


def test_an_output_whose_run_json_pins_another_output_is_refused(tmp_path: Path) -> None:
    # Given run.json copied into a folder the run was never enqueued to
    store = folder(tmp_path, "copy")
    write_run_json(store, output=(tmp_path / "out").as_uri())
    reason = output_pin_mismatch(RUN, store)
    assert reason is not None and "pins its output" in reason and (tmp_path / "out").as_uri() in reason


def test_an_unreadable_run_json_is_refused(tmp_path: Path) -> None:
    store = folder(tmp_path, "out")
    store.put(SETTINGS_KEY, b"{not json")
    reason = output_pin_mismatch(RUN, store)
    assert reason is not None and "unreadable" in reason


def test_a_trailing_slash_does_not_make_another_output(tmp_path: Path) -> None:
    store = folder(tmp_path, "out")
    write_run_json(store, output=store.url + "/")
    assert output_pin_mismatch(RUN, store) is None


def test_a_refused_output_pauses_the_run_with_the_reason() -> None:
    client = DictRedis()
    pin = OutputPin(client)
    assert not pin.confirm(RUN, open_store("file:///nonexistent/draftgen-output"))
    state = pause_state(client, RUN)
    assert state is not None and state.by == PAUSED_BY_OUTPUT_PIN and "holds no run.json" in state.reason


def test_a_confirmed_output_is_read_once_per_run(tmp_path: Path) -> None:
    client = DictRedis()
    pin = OutputPin(client)
    store = folder(tmp_path, "out")
    write_run_json(store)
    assert pin.confirm(RUN, store)
    store.delete(SETTINGS_KEY)
    assert pin.confirm(RUN, store)  # remembered: no second read
    assert pause_state(client, RUN) is None


def test_once_confirmed_a_run_is_refused_any_other_output_even_one_that_names_it(tmp_path: Path) -> None:
    # Given a run whose output this uploader confirmed
    client = DictRedis()
    pin = OutputPin(client)
    first = folder(tmp_path, "out")
    write_run_json(first)
    assert pin.confirm(RUN, first)
    # When Redis later names another output, whose run.json was forged to match
    forged = folder(tmp_path, "forged")
    write_run_json(forged)
    # Then nothing goes there and the run is paused
    assert not pin.confirm(RUN, forged)
    state = pause_state(client, RUN)
    assert state is not None and "this uploader confirmed" in state.reason


def test_a_run_already_paused_keeps_its_first_reason_and_stays_refused(tmp_path: Path) -> None:
    client = DictRedis()
    client.setnx(RunKeys(RUN).paused, b'{"reason":"by hand","by":"user","at":1.0}')
    assert not OutputPin(client).confirm(RUN, folder(tmp_path, "empty"))
    state = pause_state(client, RUN)
    assert state is not None and state.reason == "by hand"


def test_another_runs_output_is_refused_alike_for_writing_run_json_and_for_reading_it(tmp_path: Path) -> None:
    store = folder(tmp_path, "out")
    write_run_json(store, run="first-run")
    ours = RunSettings(run=RUN, sampling=SamplingSettings(), output=store.url)
    with pytest.raises(OutputTaken, match="holds the output of run 'first-run'") as writing:
        write_run_to(store, ours)
    with pytest.raises(OutputTaken) as reading:
        run_json_of(store, RUN)
    assert str(reading.value) in str(writing.value)
    assert read_run_json(store).run == "first-run"  # left as it was


@pytest.mark.parametrize(
    ("mine", "theirs", "words"),
    [
        ("s3://b/runs/a", "s3://b/runs/a/", "holds the output of run 'other'"),
        ("s3://b/runs", "s3://b/runs/a", "s3://b/runs holds s3://b/runs/a, the output of run 'other'"),
        ("s3://b/runs/a/x", "s3://b/runs/a", "s3://b/runs/a/x is inside s3://b/runs/a, the output of"),
        ("file:///data/out", "file:///data/out/r2", "holds file:///data/out/r2"),
    ],
)
def test_an_output_that_is_holds_or_lies_inside_another_runs_is_refused_naming_both(
    mine: str, theirs: str, words: str
) -> None:
    other = RunSettings(run="other", sampling=SamplingSettings(), output=theirs)
    reason = overlapping_run_output(RUN, mine, other)
    assert reason is not None and words in reason


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [
        ("s3://b/runs/run-1", "s3://b/runs/run-10"),  # a shared beginning is not a shared folder
        ("s3://b/runs/run-10", "s3://b/runs/run-1"),
        ("s3://b/runs/a", "s3://c/runs/a"),
        ("file:///data/out/a", "file:///data/out/b"),
    ],
)
def test_outputs_side_by_side_are_apart(mine: str, theirs: str) -> None:
    other = RunSettings(run="other", sampling=SamplingSettings(), output=theirs)
    assert overlapping_run_output(RUN, mine, other) is None


def test_a_run_is_never_refused_beside_itself() -> None:
    same = RunSettings(run=RUN, sampling=SamplingSettings(), output="s3://b/runs")
    assert overlapping_run_output(RUN, "s3://b/runs/x", same) is None
