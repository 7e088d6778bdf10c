"""A manifest naming an object outside the output (absolute, or climbing out with `..`) is refused by
every reader, and nothing outside is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producer.cli import main
from tests.support.run_output import completion, write_run_output
from workers.record.manifest import manifest_key

RUN = "keys"
CLOSED_REDIS = "redis://127.0.0.1:1/0"
EXIT_USAGE = 2


@pytest.mark.parametrize("key", ["../outside.parquet", "/etc/passwd", "data//part.parquet"])
@pytest.mark.parametrize(
    "command",
    [
        ["verify", "--run", RUN, "--output", "{out}"],
        ["report", "--run", RUN, "--output", "{out}", "--out", "{tmp}/report"],
        ["export", "--run", RUN, "--format", "messages", "--output", "{out}", "--to", "{tmp}/export"],
    ],
    ids=["verify", "report", "export"],
)
def test_a_manifest_key_outside_the_output_is_refused_by_every_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, command: list[str]
) -> None:
    folder = tmp_path / "run"
    url = write_run_output(folder, RUN, [[completion("p1")]])
    entry_path = folder / manifest_key(0)
    entry = json.loads(entry_path.read_text())
    entry_path.write_text(json.dumps({**entry, "key": key}))
    argv = [part.format(out=url, tmp=tmp_path) for part in command]
    assert main(["--redis-url", CLOSED_REDIS, *argv]) == EXIT_USAGE
    assert "outside" in capsys.readouterr().err
