"""HTTP plumbing of the admin API: authentication, problems, probes, metrics."""
