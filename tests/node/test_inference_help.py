"""`python -m node --help` and `python -m inference --help` tell a new user which commands to run, not how
the parser is built."""

from __future__ import annotations

import pytest

from inference.cli import build_parser as build_inference_parser
from node.cli import build_parser as build_node_parser


def test_the_node_help_lists_its_commands_in_order_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_node_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "register(subparsers)" not in text
    order = [text.index(f"python -m node {command} ") for command in ("stage", "serve", "wait", "preflight")]
    assert order == sorted(order)
    assert "python -m inference simulate" in text and "docs/gpu-nodes.md" in text


def test_the_inference_help_shows_the_simulator_and_points_to_the_node_tools(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_inference_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "python -m inference simulate" in text and "python -m node" in text
