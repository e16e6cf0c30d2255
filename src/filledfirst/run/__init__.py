"""What turns a schedule into a run folder: `runner` (start or reuse vLLM, replay, write
the folder), `search` (a capacity search on one server start, each probe a run folder,
then search.json), `folder` (the run folder's layout and how it is read back), `kept`
(finished folders kept aside across an interrupted job) and `provenance` (versions and
hardware).
"""
