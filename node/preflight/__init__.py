"""Preflight: send a handful of real prompts with a run's settings, then judge whether the data is usable.

Every way the data went bad in practice looked healthy from the outside: thinking off (87% of the
answers empty), a `max_tokens` so small that the whole budget went to thinking (`content == ""`,
finish `length`, nothing failed), a server without a reasoning parser (`<think>` in the answer).
A few completions show each of these in seconds, so preflight sends them before a run starts.

The judging is pure: `judge` turns the outcomes, the settings and what `/server_info` said into
findings, and `verdict_of` turns findings into PASS, WARN or FAIL. Only `run_preflight` and
`fetch_server_info` do I/O.

prompts.py    PreflightPrompt and the built-in prompts
outcomes.py   what was observed: PromptOutcome per prompt, ServerReading from `/server_info`, Totals
judging.py    the rules: findings (Level, Finding), `judge`, `verdict_of`, `suggest_max_tokens`
report.py     PreflightReport, `build_report` and `report_to_json`
run.py        the I/O: `run_preflight` and `fetch_server_info`
run_files.py  `--config` and `--prompts`, read by intake as `enqueue` reads them
"""
