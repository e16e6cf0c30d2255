"""Capacity search: the highest offered rate a server setting sustains under an SLO.

search.py is the engine-free core (which rate to probe next, when to stop); probes.py
turns a workload shape and a rate into one probe's workload; plan.py reads a frontier
out of the study config; run.py runs one search on one server start (`filledfirst
frontier run`), each probe a run folder; record.py types the search.json it leaves;
table.py makes the DuckDB table `frontiers`; relative.py resolves workload rates placed
relative to a search's knee.
"""
