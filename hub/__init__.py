"""The course on JupyterHub: one machine (launch.py, jupyterhub_config.py, student/) and
Kubernetes (values.yaml, Dockerfile for Zero to JupyterHub). docs/hub.md is the guide."""
