"""Load tests at tok/s/user tiers: a Locust user for OpenAI streaming (`locustfile.py`), a concurrency-step
shape (`shape.py`), and the `run` / `report` commands (`python -m sglang_dspark.loadtest --help`).

Importing this package imports no Locust: only `locustfile.py`, `shape.py` and `locust_hooks.py` do,
and they run inside Locust's own processes (Locust monkey-patches its process with gevent).
"""
