"""What-if capacity planning on the simulator: `ddbench plan` (SLO search, knob search, fleet
sizing) and `ddbench sweep` (grids on local processes or Ray).

- `scenario`: one serving configuration (model, GPU, link, host sharing, design, workload, knobs)
  and `run_point`, one seeded serving run of it at an arrival rate, as a flat row with units in
  the column names;
- `slo`: parsing `p99-completion=60s,p99-tpot=100ms` and checking a run against it;
- `search`: the highest sustainable Poisson rate meeting every SLO (bracketed, log-space);
- `knobs`: knob grids per design and Pareto fronts;
- `spec`: the sweep spec schema (pydantic), expanded into points;
- `executors`: local process pool or Ray, with a resumable point store.

Nothing here imports torch; pydantic, yaml, pyarrow and ray are imported only by the commands
that need them.
"""
