"""Fit once, price many: the offline fits of the cost model's terms and the validation against the engine.

  replay.py      one engine point replayed through the user's pricing (shared by the fits and validation)
  enginefit.py   the decode compute reconciled with the engine's kernel breakdown (EngineFit)
  reusefit.py    ShadowKV's fetch, from the bundle's reuse_fetch records (ReuseFetchFit)
  cachefill.py   dualdecoder-cache's fill, from the engine's chunk-cache sweep (CacheFill)
  fitfile.py     `python -m ddbench.sim.fit`: all three into one file, traces/fit/<gpu>/fitted.json
  validation.py  the simulator against the engine's measured points (`python -m ddbench.sim.validate`)
  summary.py     a validation table's summary: errors by regime and design, per point over its builds

Everything here stands on the pricing (sim/costmodel.py, sim/steplayers.py, sim/factory.py), never the
other way round: the cost model loads the fitted file (sim/fitted.py) and imports nothing of sim/fit/.
"""
