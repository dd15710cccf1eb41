"""The performance harness behind ``scripts/performance/launch.py``: arguments → config, results, comparisons."""
