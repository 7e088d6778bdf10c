"""A batch through one SGLang server: the batch task's logic, the generation engine and its tails,
deadlines and the silence watch, the server record, the heartbeat, the server liveness watch, and the
quality gate.

Imports `workers.state` and `workers.recovery` (a batch is worked under its lease); nothing of the output
record (completions are staged in the run state; the uploader writes them) nor of the Celery edge.
"""
