"""What turns a schedule into a run folder: `runner` (start or reuse vLLM, replay, write
the folder), `folder` (the run folder's layout and how it is read back), `kept` (finished
folders kept aside across an interrupted job), `provenance` (versions and hardware) and
`scrape` (the /metrics scraper beside a replay).

Nothing is imported here: the load generator and the engine import `scrape` alone.
"""
