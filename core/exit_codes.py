"""Exit codes every draftgen command uses, as a shell script reading them expects."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1  # the work failed; the message says whether running it again can help
EXIT_USAGE = 2  # the command, an option, the input or the environment must change (argparse uses 2 too)
EXIT_SIGNAL_BASE = 128  # stopped by a signal: 128 + its number, as a shell reports it
EXIT_INTERRUPTED = EXIT_SIGNAL_BASE + signal.SIGINT  # Ctrl-C
