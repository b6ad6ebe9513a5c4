"""The ddbench discrete-event simulator (SimPy). It imports no torch and nothing from kernels/.

  ddbench.sim.run         run(Point, mode): the one way in from outside sim/ (plan, aggregate, timeline)
  ddbench.sim.costmodel   CostModel: op times from a calibration bundle (or scaled, or roofline)
  ddbench.sim.steplayers  step_layers(): one decode step of a design, layer by layer (StepLayers)
  ddbench.sim.timeline    run_timeline(): per-layer timeline of batch steps (overlap, stalls, buffers)
  ddbench.sim.aggregate   aggregate_step(): the same step in closed form, for serving runs
  ddbench.sim.serving     run_serving(): Poisson arrivals, continuous batching, admission by memory
  ddbench.sim.hitrates    per-layer hit rates from traces/accuracy/<model>.csv or a constant
  ddbench.sim.perfetto    Chrome / Perfetto trace JSON
  ddbench.sim.factory     build a cost model from catalog names (the scenario: ddbench.planner.scenario)
"""
