"""Models: the manager that installs and verifies them, the converters to GGUF, and the file readers they use."""
