"""`python -m producer`: run the command, then leave without tearing native thread pools down.

A process that read Parquet can abort at interpreter exit (SIGABRT, "terminate called without an active
exception": an Arrow thread destroyed while still joinable, apache/arrow#34314) after its work is done
and printed, turning a success into exit -6. Once the command has returned, nothing is left to do but
flush: so the output and the logs are flushed and the process exits with the command's code at once.
"""

import logging
import os
import sys

from producer.cli import main

exit_code = main()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(exit_code)
