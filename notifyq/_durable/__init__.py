"""Durable runs: memoized steps, child runs, durable sleeps and signals (``ctx.step`` & co.)."""
