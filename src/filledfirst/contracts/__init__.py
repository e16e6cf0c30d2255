"""The contracts between stages, each type defined once: the schedule, request, token and
sample records and their Arrow schemas (`records`), run.json (`runmeta`), a capacity
search's search.json (`search`) and the scheduler's gauges from one scrape (`gauges`).
Writers build these types and encode them; readers decode them once."""
