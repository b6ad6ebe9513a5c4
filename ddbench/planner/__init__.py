"""What-if capacity planning on the simulator: `ddbench plan` (SLO search, knob search, fleet
sizing) and `ddbench sweep` (grids on local processes or Ray).

- `scenario`: the one scenario (model, GPU, link, host sharing, design, workload, knobs, hit rates)
  that simulate, plan, sweep and the figures run, and `resolve()`, which checks it and builds its
  cost model and hit rates; `scenario_args`: the flags that make one;
- `runs`: `run_point`, one seeded serving run of a scenario at an arrival rate, as a flat row with
  units in the column names, and its closed-form capacity;
- `slo`: parsing `p99-completion=60s,p99-tpot=100ms` and checking a run against it;
- `search`: the highest sustainable Poisson rate meeting every SLO (bracketed, log-space);
- `knobs`: knob grids per design and Pareto fronts;
- `spec`: the sweep spec schema (pydantic), expanded into points;
- `executors`: local process pool or Ray; `sweeprun`: a sweep's rows and resumable point store.

Nothing here imports torch; pydantic, yaml, pyarrow and ray are imported only by the commands
that need them.
"""
