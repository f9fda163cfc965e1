"""Inspection and accuracy tools: graph diffs, numeric comparison, bisection, profiling, reports."""
