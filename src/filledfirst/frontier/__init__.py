"""Capacity search's logic: the highest offered rate a server setting sustains under an SLO.

No engine and no database here: search.py is the core (which rate to probe next, when to
stop); probes.py turns a workload shape and a rate into one probe's workload; plan.py
reads a frontier out of the study config; relative.py resolves workload rates placed
relative to a search's knee. Running a search on a server is filledfirst.run.search, the
search.json it leaves is filledfirst.contracts.search, table `frontiers` is
filledfirst.analysis.frontiers.
"""
