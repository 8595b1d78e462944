"""The decision path both limiters share: routing a call to its rule, the failure
policy, local refusals and the Decision a caller gets back.
"""
