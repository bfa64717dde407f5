"""`kvplan plan`: search deployments for the cheapest that meets latency targets (search.py), with
GPU prices (prices.py)."""
