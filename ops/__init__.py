"""Operating a DSpark deployment: Prometheus rules, the Grafana dashboard, runbooks, capacity."""
