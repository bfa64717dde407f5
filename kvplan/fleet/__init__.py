"""Fleets: replicas of the serve engine behind a router (`experiment: fleet`; kvplan/fleet/run.py)."""
