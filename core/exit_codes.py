"""Exit codes every draftgen command uses, as a shell script reading them expects."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1  # the work failed; the message says whether running it again can help
EXIT_USAGE = 2  # the command, an option, the input or the environment must change (argparse uses 2 too)
# `python -m producer wait`: how the run it waited for ended (0 is finished, every prompt committed)
EXIT_FINISHED_WITH_DEAD_LETTERS = 3  # finished: every prompt in the output, some of them as dead letters
EXIT_PAUSED_BY_GATE = 4  # the quality gate paused it: the data is bad (`status` says which figure)
EXIT_PAUSED = 5  # paused by hand, or by the uploader (its output does not confirm it): `status` says why
EXIT_TIMED_OUT = 124  # --timeout passed first (as timeout(1) reports it)
EXIT_SIGNAL_BASE = 128  # stopped by a signal: 128 + its number, as a shell reports it
EXIT_INTERRUPTED = EXIT_SIGNAL_BASE + signal.SIGINT  # Ctrl-C
