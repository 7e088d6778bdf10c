"""draftgen's Lua scripts as one Redis function library: built from the scripts' own text, named by a
hash of that text, loaded by a process whose user may, and called through FCALL.

Why functions rather than EVAL: a Redis user allowed EVAL may run any Lua over the keys it may touch,
and a busy script stalls Redis for everyone; a user allowed only FCALL runs the functions loaded, and
only a user allowed FUNCTION LOAD (the producer, or anyone on a Redis without ACL users) loads them.
Loaded functions persist in the AOF and RDB, unlike the script cache.

The library and its functions carry a short hash of the library's source (`draftgen_<sha8>_stage`), so
during a rolling upgrade old and new code each call their own version. Loading is a plain FUNCTION LOAD,
and "already exists" means another process loaded the same source first. A call that finds its
function missing loads the library and calls again (a few times: the library may be deleted again
meanwhile); a user that may not load raises FunctionsMissing, which names the command that loads it.

Declared keys: FCALL checks every key a function declares for writing, so a function declares only the
keys it writes. The keys it only reads travel by name among its arguments, after a layout (one letter per
key in the caller's order: `w` declared, `r` by name) from which the function rebuilds KEYS and ARGV as
its script expects them; the script's text is unchanged. A script that writes nothing is flagged
`no-writes` and called with FCALL_RO, whose declared keys need reading only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from workers.errors import FunctionsMissing

WRITTEN = "w"  # a key the script writes: declared to FCALL
READ = "r"  # a key the script only reads: passed by name among the arguments
REST = "*"  # after a letter: that letter for every remaining key (scripts taking any number of keys)
HASH_CHARS = 8
LOAD_COMMAND = "python -m producer load-functions"
_FUNCTION_NOT_FOUND = "Function not found"
LOAD_ATTEMPTS = 3  # a call that finds its function missing loads the library and calls again, this often
_ALREADY_EXISTS = "already exists"

# Rebuilds the KEYS and ARGV a script was written for from the declared keys and the arguments of a
# call whose first argument is the layout, followed by the read keys' names, then the script's own.
_KEYS_AND_ARGUMENTS = """
local function keys_and_arguments(declared, arguments)
  local layout, keys, rest = arguments[1], {}, {}
  local next_declared, next_argument = 1, 2
  for i = 1, #layout do
    if string.sub(layout, i, i) == 'w' then
      keys[i] = declared[next_declared]
      next_declared = next_declared + 1
    else
      keys[i] = arguments[next_argument]
      next_argument = next_argument + 1
    end
  end
  for i = next_argument, #arguments do rest[#rest + 1] = arguments[i] end
  return keys, rest
end
"""


@dataclass(frozen=True)
class LuaScript:
    """One script of the protocol, and how its keys are used."""

    name: str
    body: str
    # One letter per key, WRITTEN or READ, a trailing REST repeating the letter before it;
    # empty when the script writes every key it is given.
    key_access: str = ""
    writes_nothing: bool = False  # flagged no-writes, called with FCALL_RO

    def layout(self, key_count: int) -> str:
        """The access letter of each of `key_count` keys (key_access written out)."""
        if self.key_access.endswith(REST):
            fixed, repeated = self.key_access[:-2], self.key_access[-2]
            return fixed + repeated * (key_count - len(fixed))
        if len(self.key_access) != key_count:
            raise ValueError(f"{self.name} takes {len(self.key_access)} keys, not {key_count}")
        return self.key_access

    def lua(self, function_name: str) -> str:
        """The script registered as a function: its body is the callback's, KEYS and ARGV as it expects."""
        flags = "'no-writes'" if self.writes_nothing else ""
        if self.key_access:
            head = "function(declared, arguments)\nlocal KEYS, ARGV = keys_and_arguments(declared, arguments)"
        else:
            head = "function(KEYS, ARGV)"
        registration = f"redis.register_function{{function_name='{function_name}', flags={{{flags}}}"
        return f"{registration}, callback={head}\n{self.body.strip()}\nend}}\n"


@dataclass(frozen=True)
class FunctionLibrary:
    name: str
    source: str
    scripts: tuple[LuaScript, ...]

    @classmethod
    def of(cls, prefix: str, scripts: Iterable[LuaScript]) -> FunctionLibrary:
        """The library of `scripts`, named `<prefix>_<hash of their source>`."""
        scripts = tuple(scripts)
        digest = hashlib.sha256(_source(scripts, "").encode()).hexdigest()[:HASH_CHARS]
        name = f"{prefix}_{digest}"
        return cls(name, f"#!lua name={name}\n" + _source(scripts, name), scripts)

    def function_name(self, script: str) -> str:
        return f"{self.name}_{script}"

    def script(self, name: str) -> LuaScript:
        for script in self.scripts:
            if script.name == name:
                return script
        raise KeyError(f"no script {name!r} in {self.name}")

    def load(self, client: redis.Redis) -> bool:
        """Load the library; False when it was loaded already. FunctionsMissing when this user may not."""
        try:
            client.function_load(self.source)
        except redis.exceptions.NoPermissionError as error:
            raise FunctionsMissing(
                f"Redis has no functions {self.name} (this version of draftgen) and this Redis user may "
                f"not load them: run `{LOAD_COMMAND}` as the producer ({error})"
            ) from error
        except redis.ResponseError as error:
            if _ALREADY_EXISTS in str(error):
                return False
            raise
        return True

    def bind(self, client: redis.Redis, script: str) -> LibraryFunction:
        return LibraryFunction(self, self.script(script), client)


class LibraryFunction:
    """One function of a library on one client, called as a registered script is:
    `function(keys=[...], args=[...])`, keys in the order the script documents."""

    def __init__(self, library: FunctionLibrary, script: LuaScript, client: redis.Redis) -> None:
        self._library = library
        self._script = script
        self._client = client
        self.name = library.function_name(script.name)

    def __call__(self, keys: Sequence[Any] | None = None, args: Sequence[Any] | None = None) -> Any:
        declared, arguments = self._split(list(keys or ()), list(args or ()))
        for _ in range(LOAD_ATTEMPTS):
            try:
                return self._call(declared, arguments)
            except redis.ResponseError as error:
                if not str(error).startswith(_FUNCTION_NOT_FOUND):
                    raise
            self._library.load(self._client)
        raise FunctionsMissing(
            f"Redis lost draftgen's functions {self._library.name} again each time they were loaded "
            f"({LOAD_ATTEMPTS} times): is something deleting them (FUNCTION DELETE, FUNCTION FLUSH)?"
        )

    def _split(self, keys: list[Any], args: list[Any]) -> tuple[list[Any], list[Any]]:
        if not self._script.key_access:
            return keys, args
        layout = self._script.layout(len(keys))
        declared = [key for key, access in zip(keys, layout, strict=True) if access == WRITTEN]
        named = [key for key, access in zip(keys, layout, strict=True) if access == READ]
        return declared, [layout, *named, *args]

    def _call(self, declared: list[Any], arguments: list[Any]) -> Any:
        call = self._client.fcall_ro if self._script.writes_nothing else self._client.fcall
        return call(self.name, len(declared), *declared, *arguments)


def _source(scripts: Sequence[LuaScript], library_name: str) -> str:
    functions = "".join(script.lua(f"{library_name}_{script.name}") for script in scripts)
    return _KEYS_AND_ARGUMENTS + functions
