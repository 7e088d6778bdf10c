"""Errors of the floor, one tree.

CoreError
└── SettingsRefused   retrying cannot help: the settings file cannot be read, or a value stated in it, as an
                      option or pinned is not one a run can use; the message names where the value came from

The producer reports them as its SettingsError (producer/errors.py), preflight as option errors.
"""

from __future__ import annotations

from typing import ClassVar


class CoreError(Exception):
    retry_helps: ClassVar[bool] = False


class SettingsRefused(CoreError):
    """A run's settings file, or a value stated in it, as an option or pinned, cannot be used."""
