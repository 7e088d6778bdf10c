"""`python -m inference --help` tells a new user which commands to run, not how the parser is built."""

from __future__ import annotations

import pytest

from inference.cli import build_parser


def test_the_top_level_help_lists_the_node_commands_in_order_with_examples(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "register(subparsers)" not in text
    order = [
        text.index(f"python -m inference {command} ") for command in ("stage", "serve", "wait", "preflight")
    ]
    assert order == sorted(order)
    assert "python -m inference simulate" in text and "docs/gpu-nodes.md" in text
