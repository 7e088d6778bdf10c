"""A run's settings, in one home below every side that reads them (enqueue, preflight, the workers).

- `model.py`: the struct a run pins (`RunSettings`, its quality gate and truncation policy) and the
  defaults of a new run;
- `keys.py`: every setting by the name the user states it with (an option, a TOML key): where it sits in
  the struct, the option that sets it, its type and its limits, each written once;
- `layers.py`: the TOML file, the values stated in it and as options (each checked once, where it is
  stated), and a run's settings resolved from them over the pinned copy or the defaults;
- `options.py`: the command-line options, shared by `producer enqueue` and `inference preflight`.

The pinned copy itself lives in Redis (workers/state/runs.py) and beside the output (run.json).
"""
