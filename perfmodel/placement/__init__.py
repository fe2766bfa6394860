"""Placement models: how where a job runs (links, nodes, collectives) changes its step time."""
