"""Getting work back after a crash: batch leases and their renewal, the reconciler that dispatches
stranded batches again, each generate worker's seat on its GPU (a restarted worker takes its batches
back at once), and the consumer watch that restarts a worker that stopped taking messages.

"A lease outlived its worker" starts here. Imports `workers.state`; nothing of generation, the output
record or the Celery edge.
"""
