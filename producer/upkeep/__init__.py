"""Keeping a run sound: `verify` (every prompt committed once or dead-lettered: verify.py), `gc` (orphaned
objects: gc.py), `recover` (Redis rebuilt from the output: recover.py), `files` and `load-functions`;
parser.py and command.py are the commands."""
