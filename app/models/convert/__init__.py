"""Converters from each family's published weights to the GGUF the engine loads, one module a family."""
