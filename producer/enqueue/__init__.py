"""`python -m producer enqueue`: a dataset's prompts into a run, only what is new, never lost.

parser.py      the command's options (every setting a run pins: core/run_settings/options.py)
command.py     the handler: validate everything, write run.json, pin the settings, enqueue, report
enqueuer.py    the enqueue itself: chunks stored, claimed and published, one enqueue of a run at a time
processes.py   one enqueue over several cores; part.py is the process each part runs
work_order.py  longest known work first: what a prompt is expected to take, its batch's class
fingerprints.py, file_numbers.py  which content an explicit id was enqueued with, and from which file
publisher.py   publishing batch messages fast
"""
