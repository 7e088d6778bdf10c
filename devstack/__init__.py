"""Development tooling, not shipped with draftgen: a whole local stack (redis-server with a generated
password, simulated GPUs, Celery workers, Flower) for `scripts/demo`, the tests and the benchmarks.

local_stack.py   processes started and stopped cleanly, free ports, the local Redis and its password
demo.py          `python -m devstack demo`: the whole pipeline on this machine, enqueue to verify
"""
