"""The GPU node's tools (`python -m node`): stage the model, start one SGLang server per GPU, wait until
each really generates, and judge a run's settings on it. Above what talks to SGLang (inference/) and what a
run reads (intake/).

settings.py   ServeSettings, the typed options of `serve`, with the reference workload's defaults
command.py    the SGLang command line for one GPU (the one place that knows SGLang's flag names)
launcher.py   the server processes: logs per GPU, signal forwarding, exit when one dies
model_sources.py  a model folder on local disk or under an S3 prefix
staging.py    copy it to /dev/shm once per node, verified
progress.py   the rich progress bar staging shows
units.py      byte counts for people
cli.py        `python -m node`: the `serve`, `stage` and `wait` sub-commands, and preflight's; waiting
              uses `inference.readiness`, and preflight the SGLang client, `inference.server_probe`
              and the records
preflight/    a few real completions with a run's settings, judged into PASS, WARN or FAIL with advice:
              prompts, outcomes, judging (pure), report, run (the I/O); preflight_cli.py is its command
errors.py     the error tree
"""
