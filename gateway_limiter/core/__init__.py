"""The decision path both limiters share, with no I/O in it: ``pipeline`` (routing a
call to its rule, argument checks, outcomes, ``LimiterCore``), ``failure`` (the circuit
breaker and the failure policy), ``local_refusal`` (refusing in-process what the backend
would refuse too), ``decision`` (the Decision a caller gets back) and ``status``.
"""
