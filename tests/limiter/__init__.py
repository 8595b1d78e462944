"""The threaded limiter's decisions: routing, per-caller limits, local refusals."""
