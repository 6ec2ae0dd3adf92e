"""Periodic maintenance: one module per runner, all the same shape (a config with documented
defaults, ``run_once(now) -> counts`` that tests call, a loop with a jittered interval)."""
