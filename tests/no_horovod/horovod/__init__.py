# Put first on PYTHONPATH by tests/test_without_horovod.py: `import horovod` fails as it does on Databricks
# Runtime 16+ ML, where Horovod is not installed.
raise ModuleNotFoundError("No module named 'horovod' (hidden by the course's no-Horovod test)", name="horovod")
