"""Chatterbox weights in the official layout, and golden values from the reference implementation."""
