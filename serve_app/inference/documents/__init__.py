"""Detect and parse: image rules, one metered head call, the answer."""
