"""The ddbench discrete-event simulator (SimPy). It imports no torch and nothing from kernels/.

  sim.costmodel   CostModel: op times from a calibration bundle (or scaled, or roofline)
  sim.steplayers  step_layers(): one decode step of a design, layer by layer (StepLayers)
  sim.timeline    run_timeline(): per-layer timeline of batch steps (overlap, stalls, buffers)
  sim.aggregate   aggregate_step(): the same step in closed form, for serving runs
  sim.serving     run_serving(): Poisson arrivals, continuous batching, admission by memory
  sim.hitrates    per-layer hit rates from traces/accuracy/<model>.csv or a constant
  sim.perfetto    Chrome / Perfetto trace JSON
  sim.factory     build a cost model from catalog names (the scenario: ddbench.planner.scenario)
"""
