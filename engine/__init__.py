"""Ditto live engine: audio in, a talking avatar's frames out, on the GPU."""
