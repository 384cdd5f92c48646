"""The engine: the native binding and its Python wrapper (open a voice on a device, synthesize). No Qt, no profiles."""
