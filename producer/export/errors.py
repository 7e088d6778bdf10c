"""Errors of the export: a completion that cannot become a row of the asked format.

ProducerError
└── ExportError          a completion cannot be exported in the asked format
    ├── MissingTokenIds  the format needs the server's token ids and the completion has none
    └── UnknownRole      a turn's role has no name in the asked format
"""

from __future__ import annotations

from producer.errors import ProducerError


class ExportError(ProducerError):
    """A completion cannot be exported in the asked format."""


class MissingTokenIds(ExportError):
    """The format needs the server's token ids (`return_token_ids`), and the completion has none."""


class UnknownRole(ExportError):
    """A turn's role has no name in the asked format."""
