"""Developer diagnostics used by tests, tools and `bench`: the onnxruntime reference and node traces.

Not part of the product's import path: nothing under app/ imports it but `bench`'s optional
comparison against onnxruntime.
"""
