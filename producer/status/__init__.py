"""A run's status, from Redis alone: progress, rates, ETA, cost, a row per GPU, queues, upload backlog,
dead letters, quality and the gate, and the pause state.

`gather_status` does all the reading; every figure is a pure function of the values read and of
`now` (Redis's clock, the one the event ids and staged scores use), so each is unit-tested with a
fake clock. Figures come from completed work recorded in Redis, never from server logs.

model.py     the snapshot: RunStatus and the records it is made of
figures.py   the pure figures: rates, windows, ETA, cost, GPU rows, quality, the run's state, warnings
gather.py    the reading: `gather_status`, queue depths, the run's settings, Redis's clock
view.py      the rendering for the terminal

The commands that see and steer runs: parser.py (`status`, `pause`, `resume`, `rejects`, `parked`,
`metrics`), command.py (status, pause, resume, rejects), parked.py and metrics.py (the Prometheus exporter).
"""
