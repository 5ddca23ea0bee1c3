"""Learning a reward from people: preference and annotation models, queries, labelers, schedules."""
