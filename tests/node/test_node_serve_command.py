"""The SGLang command lines `serve` builds: valid flags for 0.5.23, the reference defaults, secrets hidden."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import pytest

from core.exit_codes import EXIT_OK, EXIT_USAGE
from node import command as command_module
from node.cli import register, wide_bind_warning
from node.command import LAUNCHER_ARGS, MANAGED_FLAGS, build_command, build_commands, mask_secrets
from node.errors import OptionError
from node.settings import (
    ServeSettings,
    SpeculativeAlgorithm,
    SpeculativeSettings,
    parse_gpus,
    read_api_key,
)

SECRET = "sk-very-secret-key"


def every_option_set() -> ServeSettings:
    return ServeSettings(
        model_path="/dev/shm/Qwen3.6-27B",
        served_model_name="qwen",
        gpus=(0, 1, 6),
        base_port=31000,
        host="0.0.0.0",
        reasoning_parser="qwen3",
        speculative=SpeculativeSettings(
            algorithm=SpeculativeAlgorithm.EAGLE,
            num_steps=2,
            eagle_topk=1,
            num_draft_tokens=3,
            draft_model_path="/dev/shm/draft",
        ),
        context_length_tokens=65536,
        max_running_requests=32,
        mem_fraction_static=0.8,
        api_key=SECRET,
        log_dir=Path("/var/log/draftgen"),
        extra_args=("--log-requests", "--cuda-graph-max-bs-decode", "64"),
    )


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def flag_names(argv: tuple[str, ...]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]


def test_every_flag_serve_sets_is_one_sglang_0_5_23_accepts(sglang_flags: set[str]) -> None:
    # Given settings with every option set
    command = build_command(every_option_set(), gpu=1)

    # When I look at the flags after the launcher's own `serve --model-type llm`
    assert command.argv[1 : 1 + len(LAUNCHER_ARGS)] == LAUNCHER_ARGS
    server_flags = flag_names(command.argv[1 + len(LAUNCHER_ARGS) :])

    # Then SGLang 0.5.23 knows every one of them
    assert set(server_flags) - sglang_flags == set()
    assert len(server_flags) >= len(
        {f for f in MANAGED_FLAGS if f not in ("--model", "--speculative-draft-model")}
    )


def test_every_flag_serve_guards_is_a_real_sglang_flag(sglang_flags: set[str]) -> None:
    module_flags = {
        value
        for name, value in vars(command_module).items()
        if name.isupper() and str(value).startswith("--")
    }
    assert MANAGED_FLAGS - sglang_flags == set()
    assert module_flags - sglang_flags == set()


def test_the_defaults_are_the_reference_workload() -> None:
    settings = ServeSettings(model_path="/dev/shm/Qwen3.6-27B", served_model_name="Qwen3.6-27B", gpus=(0,))
    argv = build_command(settings, gpu=0).argv
    pairs = dict(itertools.pairwise(argv))

    assert pairs["--reasoning-parser"] == "qwen3"
    assert pairs["--speculative-algorithm"] == "NEXTN"
    assert (pairs["--speculative-num-steps"], pairs["--speculative-eagle-topk"]) == ("3", "1")
    assert pairs["--speculative-num-draft-tokens"] == "4"
    assert pairs["--max-running-requests"] == "48"
    assert pairs["--port"] == "30000"
    assert pairs["--host"] == "127.0.0.1"
    assert "--enable-metrics" in argv
    assert "--api-key" not in argv
    assert pairs["--stream-interval"] == "32"  # a chunk every ~0.7 s a request, not every decode step


def test_the_stream_interval_is_serves_own_option() -> None:
    args = parse(["serve", "--model-path", "/m", "--stream-interval", "1", "--dry-run"])
    assert args.stream_interval == 1
    settings = ServeSettings(model_path="/m", served_model_name="m", gpus=(0,), stream_interval_tokens=1)
    argv = build_command(settings, gpu=0).argv
    assert dict(itertools.pairwise(argv))["--stream-interval"] == "1"


def test_each_gpu_gets_its_own_device_port_and_log() -> None:
    commands = build_commands(every_option_set())

    assert [c.env for c in commands] == [{"CUDA_VISIBLE_DEVICES": gpu} for gpu in ("0", "1", "6")]
    assert [c.argv[c.argv.index("--port") + 1] for c in commands] == ["31000", "31001", "31006"]
    assert [c.log_path.name for c in commands] == ["sglang-gpu0.log", "sglang-gpu1.log", "sglang-gpu6.log"]
    assert commands[2].url == "http://127.0.0.1:31006"


def test_extra_flags_go_to_sglang_verbatim_at_the_end() -> None:
    argv = build_command(every_option_set(), gpu=0).argv
    assert argv[-3:] == ("--log-requests", "--cuda-graph-max-bs-decode", "64")


def test_an_extra_flag_that_would_override_a_managed_one_is_refused() -> None:
    settings = ServeSettings(model_path="/m", served_model_name="m", gpus=(0,), extra_args=("--port=1",))
    with pytest.raises(OptionError, match="--port after '--' would override"):
        build_commands(settings)


def test_mtp_is_not_offered_because_sglang_rejects_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert "MTP" not in {algorithm.value for algorithm in SpeculativeAlgorithm}
    with pytest.raises(SystemExit):
        parse(["serve", "--model-path", "/m", "--speculative-algorithm", "MTP"])
    assert "invalid choice" in capsys.readouterr().err


def test_without_speculative_decoding_no_speculative_flag_is_sent() -> None:
    settings = ServeSettings(model_path="/m", served_model_name="m", gpus=(0,), speculative=None)
    assert not [f for f in build_command(settings, 0).argv if f.startswith("--speculative")]


def test_the_api_key_never_shows_in_the_command_line_the_rendered_line_or_the_settings_repr() -> None:
    settings = every_option_set()
    command = build_command(settings, gpu=0)

    assert not any(SECRET in arg for arg in command.argv)  # `ps` shows argv to every local user
    assert command.secrets_file is not None
    assert command.argv[command.argv.index("--config") + 1] == str(command.secrets_file.path)
    assert json.dumps(SECRET) in command.secrets_file.content()
    assert SECRET not in command.render()
    assert SECRET not in repr(settings)
    assert command.secrets() == [SECRET]
    assert mask_secrets(["--admin-api-key=abc", "--x", "y"]) == ["--admin-api-key=***", "--x", "y"]


def test_dry_run_prints_one_shell_line_per_gpu_with_env_and_log(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given an API key in the environment
    monkeypatch.setenv("DRAFTGEN_API_KEY", SECRET)
    args = parse(
        ["serve", "--model-path", "/dev/shm/Qwen3.6-27B", "--gpus", "0-2", "--log-dir", str(tmp_path),
         "--dry-run", "--sglang-executable", "sglang", "--", "--log-requests"]
    )  # fmt: skip

    # When I ask for a dry run
    assert args.handler(args) == EXIT_OK

    # Then I see three runnable lines, each with its GPU, port and log, and no key
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for gpu, line in enumerate(lines):
        assert line.startswith(f"CUDA_VISIBLE_DEVICES={gpu} sglang serve --model-type llm --model-path ")
        assert f"--port {30000 + gpu} " in line
        assert "--served-model-name Qwen3.6-27B " in line
        assert line.endswith(f"--log-requests >>{tmp_path}/sglang-gpu{gpu}.log 2>&1")
        assert SECRET not in line
    assert not list(tmp_path.iterdir()), "a dry run starts nothing and writes no log"


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--gpus", "0"], "--model-path is required"),
        (
            ["--model-path", "/m", "--mem-fraction-static", "1.5"],
            "--mem-fraction-static 1.5 must be between 0 and 1",
        ),
        (["--model-path", "/m", "--served-model-name", "qwen:27b"], "must be non-empty and contain no ':'"),
        (["--model-path", "/m", "--gpus", "0,0"], "must be distinct"),
        (["--model-path", "/m", "--gpus", "a-b"], "'a-b' is not an index or a range"),
        (["--model-path", "/m", "--base-port", "65530", "--gpus", "0-7"], "outside 1024-65535"),
        (["--model-path", "/m", "--max-running-requests", "0"], "--max-running-requests 0 must be 1 or more"),
        (["--model-path", "/m", "--stream-interval", "0"], "--stream-interval 0 must be 1 or more"),
        (["--model-path", "/m", "--", "--stream-interval", "1"], "use serve's own option"),
    ],
)
def test_bad_options_are_refused_with_a_message_naming_them(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DRAFTGEN_MODEL_PATH", raising=False)
    args = parse(["serve", *argv, "--dry-run"])
    assert args.handler(args) == EXIT_USAGE
    assert complaint in capsys.readouterr().err


def test_gpu_lists_accept_ranges_and_single_indexes() -> None:
    assert parse_gpus("0-6") == (0, 1, 2, 3, 4, 5, 6)
    assert parse_gpus("3") == (3,)
    assert parse_gpus("0,2, 5-6") == (0, 2, 5, 6)


def test_the_api_key_comes_from_a_file_before_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(" from-file \n")
    assert read_api_key("KEY", key_file, {"KEY": "from-env"}) == "from-file"
    assert read_api_key("KEY", None, {"KEY": "from-env"}) == "from-env"
    assert read_api_key("KEY", None, {}) is None
    with pytest.raises(OptionError, match="cannot read it"):
        read_api_key("KEY", tmp_path / "missing", {})


@pytest.mark.parametrize(
    ("host", "api_key", "warned"),
    [
        ("0.0.0.0", None, True),
        ("::", None, True),
        ("gpu-node-3", None, True),
        ("0.0.0.0", "key", False),
        ("127.0.0.1", None, False),
        ("::1", None, False),
        ("localhost", None, False),
    ],
)
def test_serving_beyond_loopback_without_an_api_key_is_warned_about(
    host: str, api_key: str | None, warned: bool
) -> None:
    warning = wide_bind_warning(host, api_key)
    assert (warning is not None) == warned
    if warning is not None:
        assert "without an API key" in warning and "--api-key-env" in warning
